"""Chaos: 100 short jobs from two tenants while the agent, the Celery worker and the ingest reader
are SIGKILLed and restarted and Redis restarts empty. Every job must end SUCCEEDED, none may run
to completion twice, no two attempts of a job may overlap, and no GPU may be held by two
exclusive jobs at once.

The jobs police themselves: each takes an exclusive, non-blocking ``flock`` on a file for its job
id and one for each GPU it was given, and writes a violation when one is already held (a lock
dies with its process, SIGKILL included, so only a live overlap trips it). Each writes one line
when it starts and one when it completes.
"""

import os
import signal
import sys
import time
from collections import Counter

import pytest
from rest_framework.test import APIClient

from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from jobs.services import lifecycle
from tests.e2e.conftest import wait_for, wait_while_moving
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

JOBS = 100
RUN_S = 0.4


@pytest.fixture
def stack_overrides():
    """Production's node-loss grace (60 s of silence past the heartbeat's TTL): an agent killed and
    restarted is a restart, not a node loss, however long the restart takes on a loaded machine
    (issue 35: under load, when a lapsed heartbeat alone meant loss, this test's node was marked
    LOST four times in 22 s and jobs that had completed ran again)."""
    return {"COLONY_NODE_LOST_GRACE_S": "60"}


JOB_SCRIPT = r"""
import fcntl, os, sys, time
out, run_s = sys.argv[1], float(sys.argv[2])
job = os.environ["COLONY_JOB_ID"]
node = next((p[len("agent-"):] for p in os.getcwd().split(os.sep) if p.startswith("agent-")), "?")
held = []
def hold(name):
    f = open(os.path.join(out, name + ".lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        with open(os.path.join(out, "violations.txt"), "a") as v:
            v.write(f"{name} held when job {job} started\n")
    held.append(f)
hold(f"job-{job}")
for gpu in os.environ["CUDA_VISIBLE_DEVICES"].split(","):
    hold(f"gpu-{node}-{gpu}")
start = time.time()
with open(os.path.join(out, "starts.txt"), "a") as f:
    f.write(f"{job} {node} {os.getpid()} {start}\n")
time.sleep(run_s)
with open(os.path.join(out, "completions.txt"), "a") as f:
    f.write(f"{job} {node} {os.getpid()} {start} {time.time()}\n")
"""


def _kill(process) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def test_jobs_run_once_through_agent_worker_ingest_kills_and_a_redis_restart(stack, redis_server, tmp_path):
    out = tmp_path / "chaos"
    out.mkdir()
    out.chmod(0o777)  # jobs may run under another uid
    stack.start_agent("chaos-node", "6xA100-80GB")
    wait_for(lambda: stack_nodes() >= 2, timeout=120, what="the second agent's registration")

    apis = []
    for slug in ("vision", "nlp"):
        user = MembershipFactory(user=UserFactory(username=f"{slug}-user"),
                                 tenant=TenantFactory(slug=slug, guaranteed_gpus=4, max_gpus=8)).user
        api = APIClient()
        api.force_authenticate(user)
        apis.append(api)
    job_ids = []
    for i in range(JOBS):
        response = apis[i % 2].post("/api/v1/jobs/", {
            "name": f"chaos-{i}", "gpus": 1,
            "command": [sys.executable, "-c", JOB_SCRIPT, str(out), str(RUN_S)],
        }, format="json")
        assert response.status_code == 201, response.content
        job_ids.append(response.json()["id"])

    def completed() -> int:
        path = out / "completions.txt"
        return len(path.read_text().splitlines()) if path.exists() else 0

    faults = []
    # Waits last as long as jobs keep completing: a loaded machine is slower, not wrong.
    wait_while_moving(completed, 10, what="the first completions")
    agent = next(p for n, p in stack.started if n == "agent-chaos-node")
    _kill(agent)
    faults.append(("agent SIGKILL", completed()))
    time.sleep(1.0)
    stack.start_agent("chaos-node", "6xA100-80GB")

    wait_while_moving(completed, 30, what="completions after the agent restart")
    worker = next(p for n, p in stack.started if n == "worker" and p.poll() is None)
    worker_argv = worker.args
    _kill(worker)
    faults.append(("worker SIGKILL", completed()))
    stack.start("worker", worker_argv)

    ingest = next(p for n, p in stack.started if n == "ingest" and p.poll() is None)
    ingest_argv = ingest.args
    _kill(ingest)
    faults.append(("ingest SIGKILL", completed()))
    stack.start("ingest", ingest_argv)

    wait_while_moving(completed, 50, what="completions after the worker restart")
    redis_server.stop()
    faults.append(("Redis restart (empty)", completed()))
    time.sleep(2.0)
    redis_server.start()

    def ended() -> int:
        return Job.objects.filter(pk__in=job_ids, state__in=TERMINAL_STATES).count()

    try:
        wait_while_moving(ended, JOBS, interval=0.5, what="every job to end")
    finally:
        states = Counter(Job.objects.filter(pk__in=job_ids).values_list("state", flat=True))
        starts = (out / "starts.txt").read_text().splitlines() if (out / "starts.txt").exists() else []
        completions = Counter(line.split()[0] for line in (out / "completions.txt").read_text().splitlines())
        violations = (out / "violations.txt").read_text().splitlines() if (out / "violations.txt").exists() else []
        requeues = sum(Job.objects.filter(pk__in=job_ids).values_list("requeue_count", flat=True))
        ignored = int(redis_server_client(redis_server).get(lifecycle.IGNORED_REPORTS_KEY) or 0)
        print(f"\nchaos: {JOBS} jobs, faults at completions {faults}")
        print(f"chaos: final states {dict(states)}; runs started {len(starts)}, completed {sum(completions.values())}"
              f" ({sum(1 for n in completions.values() if n > 1)} jobs completed twice); requeues {requeues};"
              f" stale reports ignored {ignored}; lock violations {len(violations)}")
    assert states == {"SUCCEEDED": JOBS}
    assert sorted(completions) == sorted(str(j) for j in job_ids)
    assert [job for job, n in completions.items() if n > 1] == []
    assert violations == []


def stack_nodes() -> int:
    from monitoring.models import Node

    return Node.objects.count()


def redis_server_client(redis_server):
    import redis

    return redis.Redis.from_url(redis_server.url)
