"""The scheduler lease (jobs/services/leadership.py) as the scheduling cycle uses it: taken, kept,
handed back, taken over once expired, and the fence that refuses a superseded holder's decisions.

"Another scheduler process" is a thread here: it has its own database connection and its own
holder id, as a second process would. tests/e2e/test_scheduler_failover.py runs two real ones."""

import logging
import threading
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, connections
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job, SchedulerLease
from jobs.services import scheduling_loop as cycle_module
from jobs.services import leadership
from jobs.services.scheduling_loop import STATS_KEY, run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory

LEASE_S = 30.0


@pytest.fixture
def online_node(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=30)
    return node


def launches(redis_client):
    return [protocol.decode_command(fields) for _, fields in redis_client.xrange(protocol.command_stream("n1"))]


def other_holds(holder="standby-host:4242:feedbeef", epoch=7, expires_in_s=LEASE_S, released=False):
    """The lease as another scheduler process left it."""
    now = timezone.now()
    SchedulerLease.objects.update_or_create(name=leadership.SCHEDULER, defaults=dict(
        holder=holder, epoch=epoch, expires_at=now + timedelta(seconds=expires_in_s), acquired_at=now,
        released=released))


def in_another_process(work):
    """Run ``work`` as another scheduler would: another thread, connection and holder id."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_first_cycle_takes_the_lease_at_epoch_one_and_keeps_it(online_node):
    job = JobFactory(gpus=1)
    assert run_scheduling_cycle().placed == 1
    lease = SchedulerLease.objects.get()
    assert (lease.holder, lease.epoch, lease.released) == (leadership.holder_id(), 1, False)
    assert lease.expires_at > timezone.now()  # kept for its next cycle (test_scheduler_leader_epoch.py)
    job.refresh_from_db()
    assert job.state == JobState.PLACED


def test_the_same_process_keeps_its_epoch_from_cycle_to_cycle(online_node):
    for _ in range(3):
        assert run_scheduling_cycle().ran
    assert SchedulerLease.objects.get().epoch == 1


def test_a_handed_back_lease_passes_to_another_process_with_the_next_epoch(online_node, redis_client):
    other_holds(epoch=7, expires_in_s=-1, released=True)
    JobFactory(gpus=1)
    assert run_scheduling_cycle().placed == 1
    lease = SchedulerLease.objects.get()
    assert (lease.holder, lease.epoch) == (leadership.holder_id(), 8)
    assert not redis_client.hget(STATS_KEY, "takeovers")  # handed back: not a failover


def test_while_another_process_holds_the_lease_this_one_places_nothing(online_node, redis_client):
    other_holds(epoch=7)
    job = JobFactory(gpus=1)
    assert run_scheduling_cycle().ran is False
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert launches(redis_client) == []
    lease = SchedulerLease.objects.get()
    assert (lease.holder, lease.epoch, lease.released) == ("standby-host:4242:feedbeef", 7, False)


def test_an_expired_lease_is_taken_over_logged_and_counted(online_node, redis_client, caplog):
    other_holds(epoch=7, expires_in_s=-1)  # its holder stopped mid-cycle and never handed it back
    JobFactory(gpus=1)
    with caplog.at_level(logging.WARNING, logger="jobs.services.scheduling_loop"):
        assert run_scheduling_cycle().placed == 1
    assert SchedulerLease.objects.get().epoch == 8
    assert "taken over from standby-host:4242:feedbeef" in caplog.text
    assert redis_client.hget(STATS_KEY, "takeovers") == b"1"


def test_the_fence_refuses_a_cycle_whose_lease_was_taken_over_while_it_decided(
        online_node, redis_client, monkeypatch, caplog, django_capture_on_commit_callbacks):
    """The old leader decided, stalled past its lease, another process took over: what the old
    one decided never lands and none of its commands go out."""
    job = JobFactory(gpus=1)
    decide = cycle_module.decide

    def decide_then_stall(*args, **kwargs):
        decisions = decide(*args, **kwargs)
        assert [place.job_id for place in decisions.placements] == [job.pk]
        mine = SchedulerLease.objects.get()
        other_holds(epoch=mine.epoch + 1)  # what the standby does once this one's lease ran out
        return decisions

    monkeypatch.setattr(cycle_module, "decide", decide_then_stall)
    with caplog.at_level(logging.WARNING, logger="jobs.services.scheduling_loop"), \
            django_capture_on_commit_callbacks(execute=True) as callbacks:
        result = run_scheduling_cycle()
    assert (result.ran, result.fenced, result.placed) == (False, True, 0)
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job).exists()
    assert callbacks == [] and launches(redis_client) == []
    assert f"refused placements of jobs [{job.pk}]" in caplog.text
    assert "taken over by standby-host:4242:feedbeef (epoch 2)" in caplog.text
    assert redis_client.hget(STATS_KEY, "fenced") == b"1"
    # The new holder's lease is left as it was: the refused process did not hand it back.
    assert SchedulerLease.objects.get().holder == "standby-host:4242:feedbeef"


def test_metrics_name_the_leader_and_its_epoch(client, online_node):
    other_holds(epoch=7, expires_in_s=-1)
    run_scheduling_cycle()
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    assert families["colony_scheduler_leader_epoch"].samples[0].value == 8
    (leader,) = families["colony_scheduler_leader"].samples
    assert leader.labels == {"holder": leadership.holder_id()} and leader.value == 1  # kept between cycles
    assert families["colony_scheduler_lease_takeovers"].samples[0].value == 1
    assert families["colony_scheduler_fenced_cycles"].samples[0].value == 0


# ---------------------------------------------------------------- two connections, committed rows


@pytest.mark.django_db(transaction=True)
def test_renewal_moves_the_expiry_and_a_lost_lease_fences_its_old_holder():
    first = leadership.acquire(LEASE_S)
    assert first is not None and first.epoch == 1
    assert in_another_process(lambda: leadership.acquire(LEASE_S)) is None  # held: the standby waits
    expiry = SchedulerLease.objects.get().expires_at
    with leadership.fenced(first, LEASE_S):
        pass
    assert SchedulerLease.objects.get().expires_at > expiry  # renewed inside the decision transaction

    SchedulerLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # it stalled past its lease
    second = in_another_process(lambda: leadership.acquire(LEASE_S))
    assert second.epoch == 2 and second.took_over_from == first.holder
    with pytest.raises(leadership.Superseded), leadership.fenced(first, LEASE_S):
        JobFactory(gpus=1)  # a write the stale holder tries: rolled back with the fence
    assert not Job.objects.exists()
    leadership.release(first)  # the old holder cannot hand back what is no longer its own
    assert SchedulerLease.objects.get().holder == second.holder and not SchedulerLease.objects.get().released


@pytest.mark.django_db(transaction=True)
def test_no_one_takes_the_lease_while_its_holder_is_inside_a_decision_transaction():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one write lock per file: the standby waits on it instead of skipping the tick")
    lease = leadership.acquire(LEASE_S)
    with leadership.fenced(lease, LEASE_S):
        SchedulerLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        # Even expired, the row is locked by the open decision transaction: the standby skips
        # this tick rather than taking over under a commit that may still land.
        assert in_another_process(lambda: leadership.acquire(LEASE_S)) is None
    assert in_another_process(lambda: leadership.acquire(LEASE_S)).epoch == 2


@pytest.mark.django_db(transaction=True)
def test_a_holder_paused_inside_its_decision_transaction_is_cut_off_by_the_database():
    if connection.vendor != "postgresql":
        pytest.skip("idle_in_transaction_session_timeout is PostgreSQL's")
    import time

    lease = leadership.acquire(1.0)  # the server ends a session idle for half the lease inside it
    with pytest.raises(DatabaseError) as raised, leadership.fenced(lease, 1.0):
        JobFactory(gpus=1)
        time.sleep(0.8)  # as if stopped: the server sees the session idle in its transaction
        JobFactory(gpus=1)
    assert leadership.session_ended_while_idle(raised.value)
    assert not Job.objects.exists()  # its writes were rolled back
    time.sleep(0.5)  # its lease (not renewed: the renewal was rolled back too) runs out
    # The row is no longer locked (NOWAIT would answer None): the standby takes over on time.
    assert in_another_process(lambda: leadership.acquire(LEASE_S)).epoch == 2
