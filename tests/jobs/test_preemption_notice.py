"""Preemption with notice: a borrower asked to make room gets its stop signal with the grace it
asked for (within the operator's ceiling), and the job records how much work each preemption cost."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


@pytest.fixture
def node4(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(4):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def stops(redis_client):
    return [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if isinstance(c := protocol.decode_command(f), protocol.StopJob)]


def cycle(capture):
    with capture(execute=True):
        run_scheduling_cycle()


def report(redis_client, capture, message):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with capture(execute=True):
        consume_events(redis_client)


def preempt_borrower(redis_client, capture, **spec) -> Job:
    """A borrower runs for ten minutes, then a tenant owed the GPUs arrives."""
    borrower = JobFactory(gpus=4, tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4), **spec)
    cycle(capture)
    launch = f"launch-{borrower.pk}-1"
    report(redis_client, capture, protocol.JobStarted(node="n1", job_id=borrower.pk, pid=9, launch_id=launch,
                                                      started_at=time.time()))
    Job.objects.filter(pk=borrower.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    JobFactory(gpus=4, tenant=TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=4))
    cycle(capture)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PREEMPTING
    return borrower


def stopped(redis_client, capture, job, code):
    report(redis_client, capture, protocol.JobExited(node="n1", job_id=job.pk, exit_code=code, stopped=True,
                                                     finished_at=time.time(), launch_id=f"launch-{job.pk}-1"))
    job.refresh_from_db()
    return job


def test_a_preempted_job_gets_the_notice_it_asked_for(node4, redis_client, django_capture_on_commit_callbacks):
    borrower = preempt_borrower(redis_client, django_capture_on_commit_callbacks, preempt_grace_s=120)
    (stop,) = stops(redis_client)
    assert stop.preempt and stop.grace_seconds == 120 and stop.launch_id == f"launch-{borrower.pk}-1"


def test_the_notice_is_capped_by_the_operator(node4, redis_client, django_capture_on_commit_callbacks, settings):
    settings.COLONY_MAX_PREEMPT_GRACE_S = 30
    Job.objects.all().delete()
    preempt_borrower(redis_client, django_capture_on_commit_callbacks, preempt_grace_s=120)
    assert stops(redis_client)[0].grace_seconds == 30


def test_a_cancel_is_not_a_preemption(node4, redis_client, django_capture_on_commit_callbacks):
    from jobs.services.submission import cancel_job

    job = JobFactory(gpus=1, preempt_grace_s=120)
    cycle(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        cancel_job(job)
    (stop,) = stops(redis_client)
    assert not stop.preempt and stop.grace_seconds == 10


def test_a_job_that_does_not_checkpoint_loses_its_run(node4, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    borrower = stopped(redis_client, capture, preempt_borrower(redis_client, capture), code=-15)
    assert borrower.state == JobState.PENDING and borrower.preempt_count == 1
    assert borrower.lost_work_s == pytest.approx(600, abs=30)
    requeued = JobEvent.objects.filter(job=borrower, kind="requeued").last()
    assert "10 min of work lost (it does not checkpoint)" in requeued.message


def test_a_checkpointing_job_that_ends_within_its_notice_loses_nothing(node4, redis_client,
                                                                      django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    # Saved, and exits non-zero to say it is not done (exit 0 during the notice is success:
    # tests/jobs/test_exactly_once.py); 143 is what a SIGTERM handler conventionally returns.
    borrower = stopped(redis_client, capture, preempt_borrower(redis_client, capture, checkpoints=True), code=143)
    assert borrower.state == JobState.PENDING and borrower.lost_work_s == 0
    assert "its checkpoint keeps that work" in JobEvent.objects.filter(job=borrower, kind="requeued").last().message


def test_a_checkpointing_job_killed_after_its_notice_counts_the_run_as_lost(node4, redis_client,
                                                                            django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    borrower = stopped(redis_client, capture, preempt_borrower(redis_client, capture, checkpoints=True), code=-9)
    assert borrower.lost_work_s == pytest.approx(600, abs=30)
    assert "killed when its notice ran out" in JobEvent.objects.filter(job=borrower, kind="requeued").last().message


def test_a_job_whose_start_was_never_reported_is_not_said_to_have_not_started(
        node4, redis_client, django_capture_on_commit_callbacks):
    # Its start report was lost (the agent paused, the stream trimmed): it may well have run.
    borrower = JobFactory(gpus=4, tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4))
    cycle(django_capture_on_commit_callbacks)
    JobFactory(gpus=4, tenant=TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=4))
    cycle(django_capture_on_commit_callbacks)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PREEMPTING and borrower.started_at is None
    stopped(redis_client, django_capture_on_commit_callbacks, borrower, -15)
    message = JobEvent.objects.filter(job=borrower, kind="requeued").last().message
    assert "No start of it was reported" in message and "had not started" not in message
