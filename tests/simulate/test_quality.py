"""Scheduling-quality behaviour of the replay: physical allocation, host resources, interference,
imperfect knowledge, FGD's baselines and protocol, on traces small enough to reason about."""

import pytest

from jobs.scheduling.policies import POLICIES, PACKING_BASELINES
from jobs.scheduling.fragmentation import Workload
from jobs.scheduling.simulate import fill, replay
from jobs.scheduling.simulate.engine import Knowledge, Replay
from jobs.scheduling.simulate.metrics import fill_curve, summarise
from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob, equal_quotas, offered_load
from tests.simulate.builders import tjob, trace

GIB = 1024


def host_trace(jobs, nodes):
    """nodes: (name, gpus, cpu_milli, gpu_memory_gib)."""
    specs = tuple(NodeSpec(name, gpus, "T4", mem * GIB, rack="r1", cpu_milli=cpu, host_memory_mb=256 * GIB)
                  for name, gpus, cpu, mem in nodes)
    return Trace("host", tuple(jobs), specs)


def pod(id, milli=1000, gpus=1, cpu=0, tenant="t"):
    return TraceJob(id=id, tenant=tenant, submit_s=0.0, duration_s=100.0, gpus=gpus, gpu_milli=milli,
                    memory_mib=None, utilisation=milli / 1000, cpu_milli=cpu)


@pytest.mark.parametrize("policy", ["fair_share", "packing_without_quotas", *PACKING_BASELINES])
def test_two_half_gpu_pods_share_one_16_gib_gpu(policy):
    # Each asks for 500 milli and so half the GPU's memory: together exactly one GPU.
    cluster = host_trace([pod(1, 500), pod(2, 500)], [("a", 1, 64000, 16)])
    result = replay(cluster, POLICIES[policy], interference=0.0)
    assert result.records[1].first_start == result.records[2].first_start
    assert result.records[2].finish == pytest.approx(result.records[2].first_start + 100.0)
    assert result.memory_violations == 0


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_physical_allocation_never_exceeds_the_gpus(policy):
    # Opportunistic whole-GPU jobs may join an occupied GPU: requests then pass 100%, the GPUs not.
    jobs = [tjob(i, util=0.3, mem_gib=8, opportunistic_only=True) for i in range(1, 9)]
    points = fill_curve(trace(jobs, nodes=(("a", 2),)), POLICIES[policy], step=0.5, until=4.0)
    assert all(p.allocated <= 1.0 + 1e-9 for p in points)
    assert max(p.requested for p in points) >= max(p.allocated for p in points)
    result = replay(trace(jobs, nodes=(("a", 2),)), POLICIES[policy])
    assert all(s.physical_milli <= 2000 for s in result.samples)
    assert 0 < summarise(result)["gpu_physical_allocation"] <= 1.0


@pytest.mark.parametrize("policy", [*PACKING_BASELINES, "fair_share", "fifo_exclusive"])
def test_a_job_waits_for_cpu_rather_than_overcommitting_a_node(policy):
    # One node, two GPUs, 16 cores: two 10-core jobs cannot run at once.
    cluster = host_trace([pod(1, cpu=10000), pod(2, cpu=10000)], [("a", 2, 16000, 16)])
    result = replay(cluster, POLICIES[policy], interference=0.0)
    if policy == "fifo_exclusive":  # the walking skeleton's FIFO ignores CPU: the replay counts it
        assert result.cpu_violations == 1
        return
    assert result.cpu_violations == 0
    starts = sorted(r.first_start for r in result.records.values())
    assert starts[1] >= starts[0] + 100.0


def test_interference_slows_co_resident_jobs_by_the_neighbours_duty_cycle():
    # Two 500-milli pods on one GPU, loads summing to 1: no over-subscription, only interference.
    cluster = host_trace([pod(1, 500), pod(2, 500)], [("a", 1, 64000, 16)])
    alone = replay(cluster, POLICIES["best_fit"], interference=0.0)
    shared = replay(cluster, POLICIES["best_fit"], interference=0.2)
    start = alone.records[1].first_start
    assert alone.records[1].finish == pytest.approx(start + 100.0)
    assert shared.records[1].finish == pytest.approx(start + 100.0 / 0.8)
    assert shared.interference == 0.2 and summarise(shared)["interference"] == 0.2
    # A job alone on its GPU is not slowed.
    solo = replay(host_trace([pod(1, 500)], [("a", 1, 64000, 16)]), POLICIES["best_fit"], interference=0.2)
    assert solo.records[1].finish == pytest.approx(solo.records[1].first_start + 100.0)


def test_memory_the_scheduler_is_told_may_be_wrong_and_overflows_are_counted():
    # True peaks of 10 GiB; the scheduler is told 4 GiB, so it packs three on a 16 GiB GPU.
    jobs = [TraceJob(id=i, tenant="t", submit_s=0.0, duration_s=100.0, gpus=1, memory_mib=10 * GIB,
                     utilisation=0.2, opportunistic_only=True, seen_memory_mib=4 * GIB) for i in (1, 2, 3)]
    cluster = Trace("told", tuple(jobs), (NodeSpec("a", 1, "T4", 16 * GIB),))
    result = replay(cluster, POLICIES["packing_without_quotas"], interference=0.0)
    assert result.memory_violations >= 1


def test_delayed_usage_is_what_the_scheduler_reads():
    cluster = trace([tjob(1, util=0.6, duration=1000)])
    engine = Replay(cluster, POLICIES["fair_share"], knowledge=Knowledge(usage_delay_s=60.0))
    engine.enqueue(cluster.jobs[0], 0.0)
    engine.now = 2.0
    engine.cycle(2.0)
    engine.now = 30.0
    snapshot = engine.snapshot()
    assert snapshot.readings.gpus[snapshot.nodes[0].gpus[0].id] == 0.0  # the reading from before it started
    engine.now = 70.0
    snapshot = engine.snapshot()
    assert snapshot.readings.gpus[snapshot.nodes[0].gpus[0].id] == pytest.approx(0.6)


def test_fragmentation_counts_what_no_task_of_the_workload_can_use():
    workload = Workload.of([pod(1, 600), pod(2, 1000), pod(3, gpus=2)])
    # Two GPUs with 400 milli free each: nobody fits (600, whole, two whole): all 800 is fragment.
    assert workload.node("T4", (400, 400), 1e9, 1e9) == pytest.approx(800)
    # An empty two-GPU node strands nothing.
    assert workload.node("T4", (1000, 1000), 1e9, 1e9) == 0
    # No CPU left: every free GPU is a fragment for every task that needs CPU.
    assert Workload.of([pod(1, cpu=1000)]).node("T4", (1000,), 0, 1e9) == pytest.approx(1000)


def test_fgd_protocol_is_deterministic_per_seed_and_differs_between_seeds():
    pods = [pod(i, milli=m, cpu=2000) for i, m in enumerate([300, 700, 500, 1000, 250, 800] * 4, start=1)]
    pods += [pod(100 + i, gpus=0, cpu=8000) for i in range(3)]  # CPU-only pods take CPU too
    nodes = tuple(NodeSpec(f"n{i}", 2, "T4", 16 * GIB, cpu_milli=32000, host_memory_mb=256 * GIB) for i in range(4))
    arrivals = [[j.gpu_milli for j in fill.arrivals(pods, 8000, seed, 1.3)] for seed in (0, 0, 1)]
    assert arrivals[0] == arrivals[1] != arrivals[2]
    assert sum(m for m, j in zip(arrivals[0], fill.arrivals(pods, 8000, 0, 1.3)) if j.gpus) >= 1.3 * 8000
    runs = [fill.summary(fill.run(pods, nodes, POLICIES["fgd"], seed=s, step=0.1)) for s in (0, 0, 1)]
    assert runs[0] == runs[1]
    for policy in ("fgd", "best_fit", "fair_share"):
        readings = fill.run(pods, nodes, POLICIES[policy], seed=0, step=0.1)
        assert all(r.physical <= 1.0 + 1e-9 and r.cpu_over == 0 for r in readings), policy
        assert readings[-1].arrived >= 1.3 and readings[-1].fragmentation is not None


def test_equal_quotas_do_not_look_at_the_slice():
    quotas = equal_quotas(["a", "b", "c"], total_gpus=10)
    assert [q.guaranteed_gpus for q in quotas] == [4, 3, 3] and all(q.max_gpus == 10 for q in quotas)


def test_offered_load_is_demand_over_capacity_in_the_arrival_window():
    jobs = [tjob(1, submit=0, duration=3600, gpus=2), tjob(2, submit=3600, duration=3600, gpus=2)]
    assert offered_load(trace(jobs, nodes=(("a", 4),))) == pytest.approx(4 * 3600 / (4 * 3600))
