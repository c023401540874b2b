"""Completed jobs do not run again: the control plane's side of "exactly once".

Under load, jobs that had finished ran a second time by two routes the control plane owned: a
heartbeat lapsing for seconds marked the node LOST at once and requeued jobs that had exited 0,
whose real exit, reported late, was then dropped ("holds no GPUs there"); and an exit 0 during a
preemption notice was taken for a stop, so the job went back to the queue. Now node loss is a
suspicion with a grace, a real exit of a requeued attempt that was not started again wins over
the requeue, and an exit 0 during a notice is success. Driven through the real entry points: the
scheduling cycle, the events stream, and node health.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, JobEvent
from jobs.services.agent_events import consume_events
from jobs.services.node_health import check_node_health
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.choices import NodeHealth
from monitoring.models import Node
from monitoring.services import health
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


@pytest.fixture
def node1(db, redis_client, live_redis):
    """One node with one GPU, heartbeating, registered a while ago."""
    node = NodeFactory(name="n1", registered_at=timezone.now() - timedelta(minutes=5))
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def cycle(capture):
    with capture(execute=True):
        return run_scheduling_cycle()


def commands(redis_client, node, kind):
    return [c for _, f in redis_client.xrange(protocol.command_stream(node))
            if isinstance(c := protocol.decode_command(f), kind)]


def report(redis_client, capture, message):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with capture(execute=True):
        consume_events(redis_client)


def started(job, launch_id, node="n1"):
    return protocol.JobStarted(node=node, job_id=job.pk, pid=4242, started_at=time.time(), launch_id=launch_id)


def exited(job, launch_id, code=0, node="n1", **extra):
    return protocol.JobExited(node=node, job_id=job.pk, exit_code=code, finished_at=time.time(),
                              launch_id=launch_id, **extra)


def health_check(capture, redis_client):
    with capture(execute=True):
        return check_node_health(redis_client)


def run_then_lose_n1(redis_client, capture, settings):
    """A job runs on n1; n1 goes silent past its grace (0 here) and is lost: the job is requeued."""
    settings.COLONY_NODE_LOST_GRACE_S = 0
    job = JobFactory(gpus=1)
    cycle(capture)
    launch = f"launch-{job.pk}-1"
    report(redis_client, capture, started(job, launch))
    redis_client.delete(protocol.heartbeat_key("n1"))
    assert health_check(capture, redis_client)["lost"] == ["n1"]
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    return job, launch


# ---------------------------------------------------------------- node loss is a suspicion first


def test_a_heartbeat_that_lapses_under_load_only_makes_the_node_suspected(node1, redis_client, settings,
                                                                          django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    settings.COLONY_NODE_LOST_GRACE_S = 60
    job = JobFactory(gpus=1)
    cycle(capture)
    report(redis_client, capture, started(job, f"launch-{job.pk}-1"))
    redis_client.delete(protocol.heartbeat_key("n1"))  # a busy machine missed its refresh

    assert health_check(capture, redis_client)["lost"] == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and Node.objects.get(name="n1").state == NodeHealth.UP
    assert redis_client.hexists(health.SUSPECTED_KEY, "n1")

    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)  # heard again: suspected no more
    assert health_check(capture, redis_client)["lost"] == []
    assert not redis_client.hexists(health.SUSPECTED_KEY, "n1")
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.RUNNING, 0)


def test_a_node_silent_for_its_whole_grace_is_lost(node1, redis_client, settings, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    settings.COLONY_NODE_LOST_GRACE_S = 60
    job = JobFactory(gpus=1)
    cycle(capture)
    report(redis_client, capture, started(job, f"launch-{job.pk}-1"))
    redis_client.delete(protocol.heartbeat_key("n1"))
    assert health_check(capture, redis_client)["lost"] == []
    redis_client.hset(health.SUSPECTED_KEY, "n1", repr(time.time() - 61))  # a minute on, still silent
    assert health_check(capture, redis_client)["lost"] == ["n1"]
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.PENDING, 1)
    health_check(capture, redis_client)
    assert not redis_client.hexists(health.SUSPECTED_KEY, "n1")  # lost now, not suspected


# ---------------------------------------------------------------- a real exit wins over the requeue


def test_real_exit_after_a_lost_node_requeue_wins_when_not_restarted(node1, redis_client, settings,
                                                                     django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = run_then_lose_n1(redis_client, capture, settings)
    # The run had ended with 0 while n1 was silent; the next agent there reports it.
    report(redis_client, capture, exited(job, launch, code=0, output_tail="done\n"))
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.output_tail) == (JobState.SUCCEEDED, 0, "done\n")
    assert job.started_at is not None and job.finished_at is not None
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    last = JobEvent.objects.filter(job=job).last()
    assert (last.kind, last.attempt, last.node) == ("finished", 1, "n1")
    assert last.message.startswith("Succeeded (exit code 0).") and "requeued" in last.message
    # It left the queue: the next cycle places nothing for it.
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    health_check(capture, redis_client)  # n1 is back
    cycle(capture)
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 1)


def test_a_real_failure_after_a_requeue_also_stands(node1, redis_client, settings,
                                                    django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = run_then_lose_n1(redis_client, capture, settings)
    report(redis_client, capture, exited(job, launch, code=3))
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)


def test_a_real_exit_withdraws_a_placement_made_since_that_has_not_started(node1, redis_client, settings,
                                                                           django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    n2 = NodeFactory(name="n2")
    GpuFactory(node=n2, index=0)
    redis_client.set(protocol.heartbeat_key("n2"), "{}", ex=60)
    job, launch = run_then_lose_n1(redis_client, capture, settings)
    cycle(capture)  # placed again, on n2: attempt 2, not started yet
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PLACED, 2)

    report(redis_client, capture, exited(job, launch, code=0))
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 2)
    [withdrawn] = commands(redis_client, "n2", protocol.StopJob)
    assert withdrawn.launch_id == f"launch-{job.pk}-2"
    # n2's GPU stays held until n2 confirms that attempt gone (its launch may have started it).
    assert Allocation.objects.filter(job=job, gpu__node__name="n2", released_at__isnull=True).exists()
    report(redis_client, capture, exited(job, f"launch-{job.pk}-2", code=None, node="n2", stopped=True,
                                         absent=True))
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)


def test_a_real_exit_after_a_newer_attempt_started_ends_the_job_and_stops_that_attempt(
        node1, redis_client, settings, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    n2 = NodeFactory(name="n2")
    GpuFactory(node=n2, index=0)
    redis_client.set(protocol.heartbeat_key("n2"), "{}", ex=60)
    job, launch = run_then_lose_n1(redis_client, capture, settings)
    cycle(capture)
    report(redis_client, capture, started(job, f"launch-{job.pk}-2", node="n2"))

    # n1 was cut off, not dead: its run went on to its end, unseen. Its work is done; attempt 2,
    # run on, would complete the job a second time (found by tests/simulation, seed 186).
    report(redis_client, capture, exited(job, launch, code=0))
    report(redis_client, capture, exited(job, launch, code=0))  # re-sent after a reconnect: recorded once
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    [stop] = commands(redis_client, "n2", protocol.StopJob)
    assert stop.launch_id == f"launch-{job.pk}-2"
    # n2's GPU stays held until n2 confirms attempt 2 gone.
    assert Allocation.objects.filter(job=job, gpu__node__name="n2", released_at__isnull=True).exists()
    [note] = JobEvent.objects.filter(job=job, attempt=1, kind="finished")
    assert note.node == "n1" and "Attempt 2, started since, is stopped." in note.message
    report(redis_client, capture, exited(job, f"launch-{job.pk}-2", code=-15, node="n2", stopped=True))
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_run_ended_by_the_requeues_stop_does_not_end_the_job(node1, redis_client, settings,
                                                               django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = run_then_lose_n1(redis_client, capture, settings)
    # n1 was only slow: it gets the requeue's stop and ends the run, which had not finished.
    report(redis_client, capture, exited(job, launch, code=-15, stopped=True))
    job.refresh_from_db()
    assert (job.state, job.attempt, job.requeue_count) == (JobState.PENDING, 1, 1)


# ---------------------------------------------------------------- exit 0 during a preemption notice


@pytest.fixture
def node4(db, redis_client, live_redis):
    node = NodeFactory(name="n4")
    for i in range(4):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n4"), "{}", ex=60)
    return node


@pytest.mark.parametrize("stopped", [True, False], ids=["within-its-notice", "before-the-stop-reached-it"])
def test_exit_zero_during_preemption_notice_is_success(node4, redis_client, django_capture_on_commit_callbacks,
                                                       stopped):
    capture = django_capture_on_commit_callbacks
    borrower = JobFactory(gpus=4, tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4))
    cycle(capture)
    launch = f"launch-{borrower.pk}-1"
    report(redis_client, capture, started(borrower, launch, node="n4"))
    owed = JobFactory(gpus=4, tenant=TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=4))
    cycle(capture)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PREEMPTING

    report(redis_client, capture, exited(borrower, launch, code=0, node="n4", stopped=stopped))
    borrower.refresh_from_db()
    assert (borrower.state, borrower.exit_code, borrower.lost_work_s) == (JobState.SUCCEEDED, 0, 0)
    assert not Allocation.objects.filter(job=borrower, released_at__isnull=True).exists()
    assert not JobEvent.objects.filter(job=borrower, kind="requeued").exists()
    last = JobEvent.objects.filter(job=borrower).last()
    assert last.kind == "finished" and "Succeeded" in last.message
    cycle(capture)  # the GPUs it freed go to the job they were freed for
    owed.refresh_from_db()
    assert owed.state == JobState.PLACED
    borrower.refresh_from_db()
    assert (borrower.state, borrower.attempt) == (JobState.SUCCEEDED, 1)
