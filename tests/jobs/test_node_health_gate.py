"""A node-health check where nothing changed reads no sample, and any change, by any path, is
still seen by the next check."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import node_health
from jobs.services.commands import launch_id
from jobs.services.node_health import check_node_health
from monitoring.services import health_samples, live
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def quiet_n1(transactional_db, live_redis, redis_client):
    """Node n1 heartbeating and running exactly the job it holds. Every write commits on its own, as
    in the worker (inside one transaction that wrote them, PostgreSQL gives no change mark)."""
    node = NodeFactory(name="n1", registered_at=timezone.now() - timedelta(minutes=5))
    job = JobFactory(state=JobState.RUNNING, started_at=timezone.now() - timedelta(minutes=1))
    Allocation.objects.create(job=job, gpu=GpuFactory(node=node, index=0))
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=30)
    sample(redis_client, [job])
    return job


def sample(redis_client, jobs, extra=()):
    live.store_latest(redis_client, [protocol.NodeSample(
        node="n1", ts=time.time(), seq=1, gpus=[], running_jobs=[job.pk for job in jobs] + [j.pk for j in extra],
        running_launches=[launch_id(job.pk, job.attempt) for job in jobs],
        duty_cycles=[1.0] * (len(jobs) + len(extra)))])


def stops(redis_client):
    return [c.job_id for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if isinstance(c := protocol.decode_command(f), protocol.StopJob)]


@pytest.fixture
def samples_read(monkeypatch):
    reads = []
    real = health_samples.latest_listings

    def counted(client, *args, **kwargs):
        reads.append(1)
        return real(client, *args, **kwargs)

    monkeypatch.setattr(health_samples, "latest_listings", counted)
    return reads


def test_a_check_after_one_that_found_every_node_quiet_reads_no_sample(quiet_n1, redis_client, samples_read):
    check_node_health(redis_client)
    sample(redis_client, [quiet_n1])  # a new sample, the same jobs
    for _ in range(3):
        assert check_node_health(redis_client)["strays_stopped"] == 0
    assert len(samples_read) == 1


def test_a_stray_a_node_starts_listing_after_a_quiet_check_is_stopped(quiet_n1, redis_client, samples_read):
    check_node_health(redis_client)
    check_node_health(redis_client)
    stray = JobFactory(state=JobState.SUCCEEDED)
    sample(redis_client, [quiet_n1], extra=[stray])
    assert check_node_health(redis_client)["strays_stopped"] == 1
    assert stops(redis_client) == [stray.pk]
    assert len(samples_read) == 2


def test_a_job_moved_off_its_node_by_a_bulk_update_is_stopped_there_at_the_next_check(quiet_n1, redis_client):
    """No signal, no save(): only the database knows, and the check must still notice."""
    check_node_health(redis_client)
    check_node_health(redis_client)
    Allocation.objects.filter(job=quiet_n1).update(released_at=timezone.now())
    Job.objects.filter(pk=quiet_n1.pk).update(state=JobState.PENDING)
    assert check_node_health(redis_client)["strays_stopped"] == 1
    assert stops(redis_client) == [quiet_n1.pk]


def test_a_node_not_quiet_keeps_every_check_reading(quiet_n1, redis_client, samples_read):
    stray = JobFactory(state=JobState.SUCCEEDED)
    sample(redis_client, [quiet_n1], extra=[stray])
    for _ in range(3):
        check_node_health(redis_client)
    assert len(samples_read) == 3


def test_redis_restarted_empty_is_checked_in_full(quiet_n1, redis_client, samples_read):
    check_node_health(redis_client)
    check_node_health(redis_client)
    redis_client.flushdb()
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=30)
    stray = JobFactory(state=JobState.SUCCEEDED)
    sample(redis_client, [quiet_n1], extra=[stray])
    assert check_node_health(redis_client)["strays_stopped"] == 1
    assert node_health.Gate.read(redis_client) is not None


def test_a_node_that_joins_after_quiet_checks_is_judged_and_lost_when_silent(quiet_n1, redis_client, settings):
    settings.COLONY_NODE_LOST_GRACE_S = 0
    check_node_health(redis_client)
    check_node_health(redis_client)
    NodeFactory(name="n2", registered_at=timezone.now() - timedelta(minutes=5))  # never heartbeats
    assert check_node_health(redis_client)["lost"] == ["n2"]
