"""An idle job is requeued only while another job waits for GPUs, and then stays off the node it
idled on, so the waiting job gets the GPUs (issue 38: a requeued job went straight back onto its
GPU 0.4 s later, twice, 498 s of work lost). Through the beat task's service, the agent's exit
report and the real scheduling cycle."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services import idle_reclaim, waits
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import JobFactory, running_job
from tests.jobs.test_idle_reclaim import fill


@pytest.fixture
def idle_on_a1(vision, alice, cluster, redis_client, live_redis):
    """alice's guaranteed 1-GPU job on a1/0, idle (1%) for 90 min; vision requeues at 60 min."""
    vision.idle_requeue_minutes = 60
    vision.guaranteed_gpus = 8
    vision.max_gpus = 8
    vision.save()
    now = timezone.now().replace(microsecond=0)
    for name in ("a1", "v1"):
        redis_client.set(protocol.heartbeat_key(name), "{}", ex=60)
    job = running_job(vision, alice, [cluster["a1/0"]], started_at=now - timedelta(minutes=100), attempt=1)
    job.allocations.update(attempt=1)
    fill([cluster["a1/0"]], now - timedelta(minutes=90), now, 1.0)
    return job, now


def reclaim(capture, now):
    with capture(execute=True):
        return idle_reclaim.reclaim(now=now)


def test_no_requeue_while_nobody_waits_for_gpus(idle_on_a1, vision, alice, django_capture_on_commit_callbacks):
    job, now = idle_on_a1
    # A pending job that waits for another job to end, not for GPUs, is nobody waiting.
    blocked = JobFactory(tenant=vision, owner=alice, gpus=1)
    waits.set_reason([blocked.pk], {"code": "waiting_for_dependency", "message": "", "details": {}})
    taken = reclaim(django_capture_on_commit_callbacks, now)
    job.refresh_from_db()
    assert taken["requeue"] == 0 and job.state == JobState.RUNNING


def test_the_waiting_job_gets_the_gpu_and_the_idle_one_goes_elsewhere(
        idle_on_a1, vision, alice, cluster, redis_client, django_capture_on_commit_callbacks):
    job, now = idle_on_a1
    # Everything but v1/1 is taken: a1/0 frees once the idle job goes.
    for key in ("a1/1", "a1/2", "a1/3", "v1/0"):
        running_job(vision, alice, [cluster[key]], started_at=now)
    waiting = JobFactory(tenant=vision, owner=alice, gpus=1)
    assert reclaim(django_capture_on_commit_callbacks, now)["requeue"] == 1
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING
    with django_capture_on_commit_callbacks(execute=True):  # its agent confirms the stop
        redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
            node="a1", job_id=job.pk, exit_code=-15, stopped=True, finished_at=time.time(),
            launch_id=f"launch-{job.pk}-1")))
        consume_events(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.PENDING

    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    placed = dict(Allocation.objects.filter(job__in=[job, waiting], released_at__isnull=True)
                  .values_list("job_id", "gpu__node__name"))
    # The requeued job is older and first in the queue: without the hold it went back onto a1/0
    # and the waiting job went on waiting.
    assert placed == {waiting.pk: "a1", job.pk: "v1"}


def test_with_no_other_free_gpu_the_requeued_job_waits_and_the_waiting_one_runs(
        idle_on_a1, vision, alice, cluster, redis_client, django_capture_on_commit_callbacks):
    job, now = idle_on_a1
    for key in ("a1/1", "a1/2", "a1/3", "v1/0", "v1/1"):
        running_job(vision, alice, [cluster[key]], started_at=now)
    waiting = JobFactory(tenant=vision, owner=alice, gpus=1)
    reclaim(django_capture_on_commit_callbacks, now)
    with django_capture_on_commit_callbacks(execute=True):
        redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
            node="a1", job_id=job.pk, exit_code=-15, stopped=True, finished_at=time.time(),
            launch_id=f"launch-{job.pk}-1")))
        consume_events(redis_client)
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            run_scheduling_cycle()
    job.refresh_from_db()
    waiting.refresh_from_db()
    assert waiting.state == JobState.PLACED
    assert Allocation.objects.get(job=waiting, released_at__isnull=True).gpu == cluster["a1/0"]
    assert job.state == JobState.PENDING
