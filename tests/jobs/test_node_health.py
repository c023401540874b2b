"""Lost nodes: their jobs are requeued exactly once; strays are stopped when the node is back."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from jobs.services.node_health import check_node_health
from jobs.services.snapshot_loader import build_snapshot, forget
from monitoring.choices import AlertKind, NodeHealth
from monitoring.models import Alert, Node
from monitoring.services import live
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def running_on_n1(db, live_redis, settings):
    # What follows a loss, once silence has outlasted the grace (tests/jobs/test_exactly_once.py
    # has the grace itself): here silence is loss at once.
    settings.COLONY_NODE_LOST_GRACE_S = 0
    node = NodeFactory(name="n1", registered_at=timezone.now() - timedelta(minutes=5))
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=GpuFactory(node=node, index=0))
    return job


def stop_commands(redis_client, node="n1"):
    return [c for _, f in redis_client.xrange(protocol.command_stream(node))
            if isinstance(c := protocol.decode_command(f), protocol.StopJob)]


def test_silent_node_is_lost_and_its_job_requeued_once(running_on_n1, redis_client):
    first = check_node_health(redis_client)
    second = check_node_health(redis_client)
    assert first["lost"] == ["n1"] and second["lost"] == []
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.PENDING
    assert running_on_n1.requeue_count == 1
    assert running_on_n1.pending_reason["code"] == "node_lost"
    assert "node n1 stopped responding" in running_on_n1.pending_reason["message"]
    assert not Allocation.objects.filter(job=running_on_n1, released_at__isnull=True).exists()
    assert Node.objects.get(name="n1").state == NodeHealth.LOST
    assert Alert.objects.filter(kind=AlertKind.NODE_LOST, resolved_at__isnull=True).count() == 1


def test_after_redis_restarts_empty_no_node_is_judged_until_the_grace_has_passed(running_on_n1, redis_client,
                                                                                 settings):
    """Every heartbeat vanished with Redis: silence means nothing until agents could reconnect."""
    settings.COLONY_REDIS_RESTART_GRACE_S = 30
    assert check_node_health(redis_client)["lost"] == []  # first look at this (empty) Redis
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.RUNNING
    seen = float(redis_client.get("colony:redis:seen_since"))
    redis_client.set("colony:redis:seen_since", seen - 31)  # the grace has passed, still silent
    assert check_node_health(redis_client)["lost"] == ["n1"]


def test_heartbeating_node_is_left_alone(running_on_n1, redis_client):
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    assert check_node_health(redis_client)["lost"] == []
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.RUNNING


@pytest.mark.parametrize("ttl", [None, 10 * 365 * 24 * 3600], ids=["no expiry", "ten years"])
def test_a_heartbeat_set_to_never_expire_does_not_keep_a_node_up(running_on_n1, redis_client, ttl):
    """A node (or a job that stole its Redis password) cannot pin itself UP: a dead node's jobs
    must still be requeued."""
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=ttl)
    assert check_node_health(redis_client)["lost"] == ["n1"]
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.PENDING


def test_returning_node_stops_the_stale_process_and_its_exit_does_not_touch_the_job(running_on_n1, redis_client):
    check_node_health(redis_client)  # lost, requeued
    gpus = [protocol.GpuInfo(index=0, uuid=Allocation.objects.get().gpu.uuid, model="A100-80GB", memory_mib=81920)]
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.NodeRegistered(
        node="n1", gpus=gpus, backend="simulated", agent_version="0.1.0", hostname="h",
        running_jobs=[running_on_n1.pk])))
    consume_events(redis_client)
    # Back, but its stray holds the GPU the requeued job was given up on: not UP until it stopped.
    assert Node.objects.get(name="n1").state == NodeHealth.LOST
    assert [c.job_id for c in stop_commands(redis_client)] == [running_on_n1.pk]
    # The old process's exit report must not finish the requeued job.
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
        node="n1", job_id=running_on_n1.pk, exit_code=-15, stopped=True, finished_at=time.time())))
    consume_events(redis_client)
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.PENDING


def test_strays_reported_in_samples_are_stopped_once_per_window(running_on_n1, redis_client):
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    stray = JobFactory(state=JobState.SUCCEEDED)
    live.store_latest(redis_client, [protocol.NodeSample(node="n1", ts=time.time(), seq=1, gpus=[],
                                                         running_jobs=[running_on_n1.pk, stray.pk])])
    assert check_node_health(redis_client)["strays_stopped"] == 1
    assert check_node_health(redis_client)["strays_stopped"] == 0
    assert [c.job_id for c in stop_commands(redis_client)] == [stray.pk]


def sample(redis_client, running_jobs, node="n1", ts=None):
    live.store_latest(redis_client, [protocol.NodeSample(node=node, ts=ts or time.time(), seq=1, gpus=[],
                                                         running_jobs=running_jobs)])


def test_lost_node_that_heartbeats_again_is_revived(running_on_n1, redis_client):
    check_node_health(redis_client)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    sample(redis_client, [])
    assert check_node_health(redis_client)["revived"] == ["n1"]
    assert Node.objects.get(name="n1").state == NodeHealth.UP


def test_a_lost_node_back_with_its_requeued_job_still_running_stays_lost_until_it_stopped(
        running_on_n1, redis_client):
    """The job was requeued and its GPU released when the node was lost; UP at once, the node's
    GPU would be handed to another job while the stray still runs on it: two jobs on one GPU."""
    check_node_health(redis_client)  # lost, requeued
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    sample(redis_client, [running_on_n1.pk])

    assert check_node_health(redis_client)["revived"] == []
    assert Node.objects.get(name="n1").state == NodeHealth.LOST
    assert [c.job_id for c in stop_commands(redis_client)] == [running_on_n1.pk]

    sample(redis_client, [])  # the stray stopped
    assert check_node_health(redis_client)["revived"] == ["n1"]


def test_the_scheduler_places_nothing_on_a_lost_node_whose_heartbeat_is_back_until_it_is_up(
        running_on_n1, redis_client):
    """Found by tests/simulation (seed 367): the scheduler took a live heartbeat for "online", so a
    lost node's GPU went to a new job while the requeued job's process still ran on it."""
    check_node_health(redis_client)  # lost, requeued
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    sample(redis_client, [running_on_n1.pk])
    check_node_health(redis_client)  # its stray still runs: stays LOST
    forget()
    [n1] = build_snapshot(redis_client).nodes
    assert not n1.online

    sample(redis_client, [])
    check_node_health(redis_client)  # the stray stopped: UP
    [n1] = build_snapshot(redis_client).nodes
    assert n1.online


def test_a_lost_node_is_not_revived_on_a_sample_taken_before_it_was_lost(running_on_n1, redis_client):
    check_node_health(redis_client)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    sample(redis_client, [], ts=Node.objects.get(name="n1").state_changed_at.timestamp() - 5)

    assert check_node_health(redis_client)["revived"] == []


def test_a_node_that_reports_no_attempts_has_a_job_it_stops_reporting_requeued_after_the_grace(
        running_on_n1, redis_client, django_capture_on_commit_callbacks):
    """An older agent lists job ids only and is never asked; the long grace is the backstop."""
    from jobs.services import node_health

    type(running_on_n1).objects.filter(pk=running_on_n1.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    now = time.time()

    def report(ts, jobs):
        return node_health.requeue_vanished(redis_client, "n1", {"ts": ts, "running_jobs": jobs})

    assert report(now - 100, [running_on_n1.pk]) == 0
    assert report(now - 90, []) == 0  # missing, but only just
    assert report(now - 40, [running_on_n1.pk]) == 0  # back: the clock restarts
    assert report(now - 30, []) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert report(now + 31, []) == 1
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.PENDING and running_on_n1.requeue_count == 1
    assert running_on_n1.pending_reason["code"] == "vanished_from_node"
    assert [c.job_id for c in stop_commands(redis_client)] == [running_on_n1.pk]


def test_a_job_being_requeued_when_its_node_is_lost_goes_back_to_the_queue(running_on_n1, redis_client):
    running_on_n1.state = JobState.PREEMPTING
    running_on_n1.save()
    assert check_node_health(redis_client)["lost"] == ["n1"]
    running_on_n1.refresh_from_db()
    assert running_on_n1.state == JobState.PENDING  # no exit will come to move it on


def test_a_duty_cycle_that_did_not_reach_the_node_is_sent_again_once_it_stays_wrong(running_on_n1, redis_client):
    """The job was suspended (stored duty cycle 0) but the SuspendJob was lost: the node's samples
    say it runs at full speed. Once they have said so about the same stored value over 5 s it is
    sent again, and at most once every 30 s; a throttle still on its way is not."""
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    Allocation.objects.filter(job=running_on_n1).update(duty_cycle=0.0)
    job_id = running_on_n1.pk

    def sample(duty: float, at: float) -> None:
        live.store_latest(redis_client, [protocol.NodeSample(node="n1", ts=at, seq=1, gpus=[], running_jobs=[job_id],
                                                             duty_cycles=[duty])])

    def sent() -> list:
        return [c.kind for _, f in redis_client.xrange(protocol.command_stream("n1"))
                if (c := protocol.decode_command(f)) and c.job_id == job_id]

    now = time.time()
    sample(1.0, now - 6)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 0  # (first seen: maybe on its way)
    sample(1.0, now - 3)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 0
    sample(1.0, now)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 1 and sent() == ["suspend"]
    for at in (now + 3, now + 6, now + 9):
        sample(1.0, at)
        assert check_node_health(redis_client)["duty_cycles_resent"] == 0  # (30 s apart)
    assert sent() == ["suspend"]

    # The stored value moved since it was first seen wrong: a throttle on its way, not a loss.
    redis_client.delete(f"colony:duty-resent:n1:{job_id}")
    Allocation.objects.filter(job=running_on_n1).update(duty_cycle=0.5)
    sample(1.0, now + 7)
    check_node_health(redis_client)
    Allocation.objects.filter(job=running_on_n1).update(duty_cycle=0.25)
    sample(1.0, now + 13)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 0
    sample(0.25, now + 20)  # (it arrived)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 0 and sent() == ["suspend"]

    # Seen faster, then not for a while: seen faster again starts the 5 s anew.
    sample(1.0, now + 26)
    assert check_node_health(redis_client)["duty_cycles_resent"] == 0 and sent() == ["suspend"]


def test_a_job_its_node_runs_slower_than_stored_is_left_alone(running_on_n1, redis_client):
    """The idle policy suspends a job without storing it (so that no throttle resumes it): the
    node says 0 where 1 is stored, for as long as it likes, and nothing is sent."""
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=10)
    now = time.time()
    for at in (now - 20, now - 10, now):
        live.store_latest(redis_client, [protocol.NodeSample(node="n1", ts=at, seq=1, gpus=[],
                                                             running_jobs=[running_on_n1.pk], duty_cycles=[0.0])])
        assert check_node_health(redis_client)["duty_cycles_resent"] == 0
    assert [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if (c := protocol.decode_command(f))] == []
