"""An agent's "not here" answer, replayed after the attempt started, does not requeue it.

Found by the soak (tests/e2e/test_soak.py, issue 35): the control plane asked a node about a
placed attempt whose launch had been trimmed from the node's command stream; the agent answered
that it did not know it (true then). The launch was re-sent and the job ran. Redis was then
killed, and the reconnecting agent sent its recent exits again, that old answer among them: the
control plane took it for the running attempt vanishing, requeued the job, and it ran a second
time. An absent answer dated before the attempt's start (both on the node's clock) is now
ignored; one given after it still requeues at once. Driven through the events stream.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.services import lifecycle
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def node1(db, redis_client, live_redis):
    node = NodeFactory(name="n1", registered_at=timezone.now() - timedelta(minutes=5))
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def report(redis_client, capture, message):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with capture(execute=True):
        consume_events(redis_client)


def absent(job, launch, at):
    """The agent's answer to a question about ``launch`` it does not know (``Agent._answer_query``)."""
    return protocol.JobExited(node="n1", job_id=job.pk, exit_code=None, absent=True, launch_id=launch,
                              error="this node does not know that attempt", finished_at=at)


def running_job(redis_client, capture, started_at):
    job = JobFactory(gpus=1)
    with capture(execute=True):
        run_scheduling_cycle()
    launch = f"launch-{job.pk}-1"
    report(redis_client, capture, protocol.JobStarted(node="n1", job_id=job.pk, pid=4242, started_at=started_at,
                                                      launch_id=launch))
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job, launch


def test_an_absent_answer_given_before_the_start_and_replayed_after_it_leaves_the_job_running(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    now = time.time()
    job, launch = running_job(redis_client, capture, started_at=now - 5)
    report(redis_client, capture, absent(job, launch, at=now - 12))  # said while the launch was lost
    job.refresh_from_db()
    assert (job.state, job.attempt, job.requeue_count) == (JobState.RUNNING, 1, 0)


def test_an_absent_answer_given_after_the_start_still_requeues_at_once(node1, redis_client,
                                                                       django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    now = time.time()
    job, launch = running_job(redis_client, capture, started_at=now - 5)
    report(redis_client, capture, absent(job, launch, at=now))  # the agent lost it since
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.PENDING, 1)


def test_a_replayed_absent_answer_does_not_end_a_stop_whose_run_goes_on(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    now = time.time()
    job, launch = running_job(redis_client, capture, started_at=now - 5)
    with capture(execute=True):
        lifecycle.begin_requeue(job.pk, by="an operator")  # PREEMPTING: told to stop
    report(redis_client, capture, absent(job, launch, at=now - 12))  # said before it started
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING  # its process still runs: its own exit ends the stop
    report(redis_client, capture, protocol.JobExited(node="n1", job_id=job.pk, exit_code=-15, stopped=True,
                                                     launch_id=launch, finished_at=time.time()))
    job.refresh_from_db()
    assert job.state == JobState.PENDING
