"""The guarantee is kept on the node: a borrower packed beside a running guaranteed job on a GPU
they saturate together is cut by the node's agent within seconds, however slow the central loop.

Issue 34: on a loaded machine the central scheduling ticks expired, and the borrower ran at full
speed for 45-50 s beside the guaranteed job on a GPU at 100%. Here the real stack runs (worker with
beat, ingest, two simulated single-GPU agents at the production sample interval of 1 s) with both
cores kept busy by CPU burners, and with the central loop's tick set to an hour: only the nudges of
the submissions run a cycle, so after the last placement the control plane says nothing more, as
when its ticks expire. Both orders run at once, one per node: the guaranteed job first (the
issue's), and the borrower first (the guaranteed job placed beside it).

What a user notices, from the samples the node sends: the shared GPU leaves saturation, the
borrower runs below what the control plane set for it, and the guaranteed job runs untouched.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from rest_framework.test import APIClient

from agents import protocol
from tests.e2e.conftest import WORKER_ARGV, Processes, agent_env, stack_environment, wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

# The two workloads (ramp shortened from 10 s to keep the test short): together they ask
# for 130% of the GPU.
GUARANTEED_LOAD = "train:mem=8000,util=70,period=5,ramp=3"
BORROWER_LOAD = "train:mem=8000,util=60,period=5,ramp=3"
SATURATED = 90.0  # GPU utilisation, percent
CUT_WITHIN_S = 10.0  # the central loop alone took 45-50 s under load


@pytest.fixture
def burners():
    """Two CPU-bound processes (nice 0) for the test's duration: both cores of a CI box busy."""
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield started
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def quiet_loop_stack(transactional_db, live_redis, tmp_path, request, settings, burners):
    """Worker + beat (tick: an hour) + ingest + agents ``g-first`` (1 V100) and ``b-first`` (1 A10)."""
    # The central loop ticks once an hour: only submissions nudge a cycle, so a cut is the node's.
    env = stack_environment(live_redis, tmp_path, COLONY_SCHEDULER_INTERVAL="3600")
    settings.COLONY_AGENT_SECRET, settings.COLONY_AGENT_AUTH = env["COLONY_AGENT_SECRET"], "required"
    processes = Processes(env, tmp_path)
    processes.start("worker", [*WORKER_ARGV, "-s", str(tmp_path / "beat-schedule")])
    processes.start("ingest", [sys.executable, "manage.py", "ingest", "--block-ms", "200", "--hold-s", "2"])
    for node, spec in (("g-first", "1xV100-32GB"), ("b-first", "1xA10-24GB")):
        processes.start(f"agent-{node}", [
            sys.executable, "-m", "agents", "--node", node, "--simulate", spec, "--redis", live_redis,
            "--interval", "1", "--heartbeat-ttl", "10", "--workdir", str(tmp_path / f"agent-{node}"),
            "--allow-root-jobs",
        ], env=agent_env(env, node))
    from monitoring.models import Node

    try:
        wait_for(lambda: Node.objects.filter(name__in=("g-first", "b-first")).count() == 2, timeout=60,
                 what="agent registration")
        yield processes
    except BaseException:
        print(processes.logs())
        raise
    finally:
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(processes.logs())
        processes.stop_all()


def client_of(username: str, tenant) -> APIClient:
    client = APIClient()
    client.force_authenticate(MembershipFactory(user=UserFactory(username=username), tenant=tenant).user)
    return client


def submit(api, seconds: int, model: str, load: str, **spec) -> int:
    response = api.post("/api/v1/jobs/", {"command": ["sleep", str(seconds)], "gpus": 1, "gpu_models": [model],
                                          "gpu_memory_mib": 10000, "env": {"COLONY_SIM_WORKLOAD": load}, **spec},
                        format="json")
    assert response.status_code == 201, response.json()
    # A submission nudges the loop, one nudge per 300 ms window: with no tick to catch a job
    # missed, the next one waits out the window.
    time.sleep(0.4)
    return response.json()["id"]


def running(api, job_id: int, timeout: float = 45) -> dict:
    return wait_for(lambda: (j := api.get(f"/api/v1/jobs/{job_id}/").json())["state"] == "RUNNING" and j,
                    timeout=timeout, interval=0.25, what=f"job {job_id} to run")


def node_samples(client, node: str) -> list[protocol.NodeSample]:
    """Every sample ``node`` sent, oldest first: those fanned in, and those not yet."""
    entries = [fields for _, fields in client.xrange(protocol.METRICS_STREAM)]
    entries += [fields for _, fields in client.xrange(protocol.node_metrics_stream(node))]
    by_seq = {}
    for fields in entries:
        sample = protocol.decode_sample(fields)
        if sample.node == node:
            by_seq[sample.seq] = sample
    return [by_seq[seq] for seq in sorted(by_seq)]


def duty_of(sample: protocol.NodeSample, job_id: int) -> float | None:
    jobs = list(sample.running_jobs)
    return sample.duty_cycles[jobs.index(job_id)] if job_id in jobs else None


def test_the_node_cuts_a_borrower_beside_a_saturated_guaranteed_job_in_seconds_while_the_loop_is_silent(
        quiet_loop_stack, live_redis, redis_client):
    vision = TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=2)
    nlp = TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=2)
    alice, bob = client_of("alice", vision), client_of("bob", nlp)

    def guaranteed(model):
        return submit(alice, 50, model, GUARANTEED_LOAD, shareable=True)

    def borrower(model):
        return submit(bob, 150, model, BORROWER_LOAD, gpu_milli=500, opportunistic_only=True)

    # First of each pair: the guaranteed job on the V100 node, the borrower on the A10 node.
    g_first = {"guaranteed": guaranteed("V100-32GB")}
    b_first = {"borrower": borrower("A10-24GB")}
    running(alice, g_first["guaranteed"])
    running(bob, b_first["borrower"])
    g_first["borrower"] = borrower("V100-32GB")
    b_first["guaranteed"] = guaranteed("A10-24GB")
    for pair, node in ((g_first, "g-first"), (b_first, "b-first")):
        for who, job_id in pair.items():
            job = running(alice if who == "guaranteed" else bob, job_id)
            assert [a["node"] for a in job["allocations"]] == [node], (who, job)

    # The launches said how each job was admitted, and gave the borrower its floor.
    launches = {c.job_id: c for node in ("g-first", "b-first")
                for _, f in redis_client.xrange(protocol.command_stream(node))
                if isinstance(c := protocol.decode_command(f), protocol.LaunchJob)}
    for pair in (g_first, b_first):
        assert launches[pair["guaranteed"]].job_class == "guaranteed"
        assert (launches[pair["borrower"]].job_class, launches[pair["borrower"]].duty_cycle_floor) == (
            "opportunistic", 0.1)

    for pair, node in ((g_first, "g-first"), (b_first, "b-first")):
        both = {pair["guaranteed"], pair["borrower"]}
        saturated = wait_for(lambda: next((s for s in node_samples(redis_client, node)
                                           if both <= set(s.running_jobs) and s.gpus[0].util_sm >= SATURATED), None),
                             timeout=30, interval=0.25, what=f"the GPU of {node} to saturate")
        # What the control plane set for the borrower (its ceiling): it sends nothing more.
        ceiling = bob.get(f"/api/v1/jobs/{pair['borrower']}/").json()["allocations"][0]["duty_cycle"]

        def relieved():
            return next((s for s in node_samples(redis_client, node) if s.seq > saturated.seq
                         and s.gpus[0].util_sm < SATURATED and duty_of(s, pair["borrower"]) is not None
                         and duty_of(s, pair["borrower"]) < ceiling), None)

        cut = wait_for(relieved, timeout=CUT_WITHIN_S + 20, interval=0.25, what=f"the borrower on {node} to be cut")
        took = cut.ts - saturated.ts
        print(f"{node}: GPU saturated at seq {saturated.seq} ({saturated.gpus[0].util_sm}%), borrower cut to "
              f"{duty_of(cut, pair['borrower'])} (control plane: {ceiling}) with the GPU at {cut.gpus[0].util_sm}% "
              f"{took:.1f} s later")
        assert took <= CUT_WITHIN_S, f"{node}: {took:.1f} s from saturation to the cut"
        after = [s for s in node_samples(redis_client, node) if s.seq >= saturated.seq]
        assert all(duty_of(s, pair["guaranteed"]) in (None, 1.0) for s in after)  # never throttled
        assert min(d for s in after if (d := duty_of(s, pair["borrower"])) is not None) >= 0.1  # the floor
        # The control plane was silent: it never moved the borrower meanwhile.
        assert bob.get(f"/api/v1/jobs/{pair['borrower']}/").json()["allocations"][0]["duty_cycle"] == ceiling
