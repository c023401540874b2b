"""Scheduler failover with fencing, with real processes: two Celery workers (each with its own
beat) run scheduling cycles against the test database and a private Redis. The one that decides
to place a job is stopped with SIGSTOP before its decision lands, and kept stopped past its lease;
the other takes over within the lease and places a more urgent job on the same GPU. Then the old
one is resumed: what it decided is refused and logged, never applied (no GPU held twice).

The pause is set off from inside the stopped process, at an exact point of its cycle (after the
core decided, or inside the decision transaction after apply wrote), because a SIGSTOP sent from
outside at a random moment would mostly land between cycles, where there is nothing to fence.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job, SchedulerLease
from tests.e2e.conftest import WORKER_ARGV, Processes, agent_secret, database_url, wait_for
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory

pytestmark = pytest.mark.e2e

LEASE_S = 3.0
INTERVAL_S = 0.5
# Starts a Celery worker (argv after -c) with the pause of :func:`pause_when_armed` installed.
BOOT = ("import sys, django; django.setup(); "
        "from tests.e2e.test_scheduler_failover import pause_when_armed; pause_when_armed(); "
        "from celery.__main__ import main; sys.argv[0] = 'celery'; sys.exit(main())")


def pause_when_armed() -> None:
    """In a scheduler process: the first cycle that places something after the file
    ``COLONY_TEST_PAUSE_ARM`` appears (whichever process claims it: unlinking is atomic) writes
    what it decided to ``COLONY_TEST_PAUSE_REPORT`` and stops itself at ``COLONY_TEST_PAUSE_AT``."""
    from jobs.services import scheduling_loop as cycle

    arm, report, point = (os.environ[f"COLONY_TEST_PAUSE_{name}"] for name in ("ARM", "REPORT", "AT"))

    def stop(job_ids: list[int]) -> None:
        try:
            os.unlink(arm)
        except FileNotFoundError:
            return
        lease = SchedulerLease.objects.values("holder", "epoch").get()
        Path(report).write_text(json.dumps({"pid": os.getpid(), "jobs": job_ids, "epoch": lease["epoch"],
                                            "holder": lease["holder"], "stopped_at": time.time()}))
        os.kill(os.getpid(), signal.SIGSTOP)

    decide, apply_decisions = cycle.decide, cycle.apply_decisions

    def deciding(*args, **kwargs):
        decisions = decide(*args, **kwargs)
        if point == "decided" and decisions.placements:
            stop([place.job_id for place in decisions.placements])
        return decisions

    def applying(decisions, *args, **kwargs):
        applied = apply_decisions(decisions, *args, **kwargs)
        if point == "in_transaction" and applied.placed:
            stop([place.job_id for place in decisions.placements])
        return applied

    cycle.decide, cycle.apply_decisions = deciding, applying


@pytest.fixture
def schedulers(transactional_db, live_redis, tmp_path, request):
    """Two scheduler processes; yields ``start(point) -> (processes, report_path, arm_path)``."""
    processes = Processes({}, tmp_path)

    def start(point: str):
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "cluster_ui.settings",
            "DATABASE_URL": database_url(),
            "REDIS_URL": live_redis,
            "CELERY_BROKER_URL": live_redis,
            "COLONY_VAR_DIR": str(tmp_path / "var"),
            "COLONY_SCHEDULER_INTERVAL": str(INTERVAL_S),
            "COLONY_EVENTS_INTERVAL": "1",
            "COLONY_SCHEDULER_LOCK_LEASE": str(LEASE_S),
            "COLONY_AGENT_SECRET": agent_secret(),
            "COLONY_AGENT_AUTH": "required",
            "COLONY_TEST_PAUSE_ARM": str(tmp_path / "arm"),
            "COLONY_TEST_PAUSE_REPORT": str(tmp_path / "report.json"),
            "COLONY_TEST_PAUSE_AT": point,
            "PYTHONUNBUFFERED": "1",
        }
        processes.env = env
        for name in ("scheduler-1", "scheduler-2"):
            # WORKER_ARGV's options after ``-m celery``, run through BOOT instead.
            processes.start(name, [sys.executable, "-c", BOOT, *WORKER_ARGV[3:], "-n", f"{name}@%h",
                                   "-s", str(tmp_path / f"{name}.schedule")])
        for name in ("scheduler-1", "scheduler-2"):
            wait_for(lambda: " ready." in (tmp_path / f"{name}.log").read_text(), timeout=40, what=f"{name} to start")
        return processes, tmp_path / "report.json", tmp_path / "arm"

    try:
        yield start
    except BaseException:
        print(processes.logs())
        raise
    finally:
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(processes.logs())
        for _, process in processes.started:  # a stopped process would not see SIGTERM
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
        processes.stop_all()


def live_allocations_by_gpu() -> dict[int, list[int]]:
    held: dict[int, list[int]] = {}
    for gpu_id, job_id in Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", "job_id"):
        held.setdefault(gpu_id, []).append(job_id)
    return held


@pytest.mark.parametrize("point", ["decided", "in_transaction"])
def test_a_leader_paused_past_its_lease_is_replaced_and_nothing_it_decided_lands(schedulers, redis_client, point):
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=120)  # the node is up (no agent needed)
    processes, report_path, arm = schedulers(point)
    by_pid = {process.pid: (name, process) for name, process in processes.started}
    wait_for(lambda: SchedulerLease.objects.exists(), timeout=20, what="a first cycle")

    tenant = TenantFactory(slug="vision", guaranteed_gpus=1, max_gpus=1)
    arm.touch()
    first = JobFactory(tenant=tenant, gpus=1, priority=0)
    report = wait_for(lambda: report_path.exists() and report_path.read_text() and json.loads(report_path.read_text()),
                      timeout=20, what="a scheduler to decide and stop")
    stopped_name, stopped = by_pid[report["pid"]]
    standby_name, standby = next(entry for pid, entry in by_pid.items() if pid != report["pid"])
    assert report["jobs"] == [first.pk]
    assert psutil.Process(stopped.pid).status() == psutil.STATUS_STOPPED

    # While the old leader is stopped, a more urgent job arrives: the standby, once it has taken
    # the lease over, gives it the one GPU the stopped leader had decided to give the first job.
    urgent = JobFactory(tenant=tenant, gpus=1, priority=10)
    wait_for(lambda: Job.objects.filter(pk=urgent.pk, state=JobState.PLACED).exists(), timeout=LEASE_S + 10,
             what=f"{standby_name} to take over and place the urgent job")
    lease = SchedulerLease.objects.get()
    assert lease.epoch > report["epoch"] and lease.holder.split(":")[1] == str(standby.pid)
    failover_s = lease.acquired_at.timestamp() - report["stopped_at"]
    print(f"\nfailover ({point}): {failover_s:.2f} s from SIGSTOP to {standby_name}'s first cycle "
          f"(lease {LEASE_S} s, tick {INTERVAL_S} s)")
    assert failover_s <= LEASE_S + INTERVAL_S + 1.5, failover_s
    assert psutil.Process(stopped.pid).status() == psutil.STATUS_STOPPED  # it really was out all along

    cycles = int(redis_client.hget("colony:scheduler:stats", "cycles") or 0)
    os.kill(stopped.pid, signal.SIGCONT)
    # Its stale cycle ends at once (refused, or, were there no fence, applied); both then go on.
    wait_for(lambda: int(redis_client.hget("colony:scheduler:stats", "cycles") or 0) >= cycles + 4, timeout=15,
             what="both schedulers to go on cycling")
    assert stopped.poll() is None and standby.poll() is None
    assert live_allocations_by_gpu() == {gpu.pk: [urgent.pk]}, "a GPU is held twice"
    first.refresh_from_db()
    assert first.state == JobState.PENDING and not Allocation.objects.filter(job=first).exists()
    commands = [protocol.decode_command(fields) for _, fields in redis_client.xrange(protocol.command_stream("n1"))]
    launched = {command.job_id for command in commands if isinstance(command, protocol.LaunchJob)}
    assert first.pk not in launched and urgent.pk in launched
    log = (processes.log_dir / f"{stopped_name}.log").read_text()
    assert "scheduling cycle fenced off" in log and f"refused placements of jobs [{first.pk}]" in log
