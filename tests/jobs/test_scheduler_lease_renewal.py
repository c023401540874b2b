"""A scheduling cycle slower than its lease keeps it (jobs/services/leadership.py LeaseKeeper): its
placements commit under the epoch it began with, and no other process takes over or computes them
again. A leader that stops renewing (here: a cycle hung past COLONY_SCHEDULER_MAX_CYCLE_S; a
stopped process stops its keeper too, tests/e2e/test_scheduler_failover.py) loses the lease, and
what it decided is refused.

"Another scheduler process" is a thread with its own connection and holder id, as in
tests/jobs/test_leadership.py; the rows are committed so that both see them."""

import logging
import time

import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job, SchedulerLease
from jobs.services import leadership
from jobs.services import scheduling_loop as cycle_module
from jobs.services.scheduling_loop import STATS_KEY, run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory
from tests.jobs.test_leadership import in_another_process, launches

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S = 1.0


@pytest.fixture
def short_lease(settings, redis_client, live_redis):
    settings.COLONY_SCHEDULER_LOCK_LEASE = LEASE_S
    settings.COLONY_SCHEDULER_MAX_CYCLE_S = 60.0
    GpuFactory(node=NodeFactory(name="n1"), index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return settings


def slow_decide(monkeypatch, seconds: float, while_slow=lambda: None):
    """The pure core takes ``seconds`` (a cold cycle under load); ``while_slow`` runs at its end,
    still inside the decide stage, as another process's tick would."""
    decide = cycle_module.decide
    seen = {}

    def slow(*args, **kwargs):
        decisions = decide(*args, **kwargs)
        time.sleep(seconds)
        seen["standby"] = while_slow()
        return decisions

    monkeypatch.setattr(cycle_module, "decide", slow)
    return seen


def test_a_cycle_slower_than_its_lease_keeps_it_and_commits_its_placements(short_lease, monkeypatch, redis_client,
                                                                         caplog):
    job = JobFactory(gpus=1)
    # 2.5 leases into the cycle another scheduler's tick tries to take the lease over.
    seen = slow_decide(monkeypatch, 2.5 * LEASE_S, lambda: in_another_process(lambda: leadership.acquire(LEASE_S)))
    with caplog.at_level(logging.WARNING):
        result = run_scheduling_cycle()
    assert seen["standby"] is None, "another process took over a lease its holder was still using"
    assert (result.ran, result.fenced, result.placed) == (True, False, 1)
    lease = SchedulerLease.objects.get()
    assert lease.epoch == 1 and lease.holder == leadership.holder_id()  # no takeover, no new epoch
    job.refresh_from_db()
    assert job.state == JobState.PLACED and Allocation.objects.filter(job=job).count() == 1
    assert [command.job_id for command in launches(redis_client)] == [job.pk]  # computed and sent once
    assert not redis_client.hget(STATS_KEY, "fenced") and not redis_client.hget(STATS_KEY, "takeovers")
    assert "outlived" not in caplog.text  # the Redis lock was extended along with the lease


def test_a_leader_that_stops_renewing_loses_the_lease_and_its_late_write_is_fenced(
        short_lease, monkeypatch, redis_client, caplog):
    short_lease.COLONY_SCHEDULER_MAX_CYCLE_S = LEASE_S  # its keeper gives up after one lease
    job = JobFactory(gpus=1)
    seen = slow_decide(monkeypatch, 3 * LEASE_S, lambda: in_another_process(lambda: leadership.acquire(LEASE_S)))
    with caplog.at_level(logging.WARNING):
        result = run_scheduling_cycle()
    standby = seen["standby"]
    assert standby is not None and standby.epoch == 2, "the standby waited on a lease no one renews"
    assert (result.ran, result.fenced, result.placed) == (False, True, 0)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not Allocation.objects.filter(job=job).exists()
    assert launches(redis_client) == []
    assert f"refused placements of jobs [{job.pk}]" in caplog.text
    assert "no longer renewed" in caplog.text
    assert SchedulerLease.objects.get().holder == standby.holder  # the late holder did not hand it back


def test_renewal_extends_only_a_lease_still_held_by_its_holder():
    lease = leadership.acquire(LEASE_S)
    before = SchedulerLease.objects.get().expires_at
    time.sleep(0.05)
    assert in_another_process(lambda: leadership.renew(lease, 30.0)) is True  # from the keeper's thread
    assert SchedulerLease.objects.get().expires_at > before
    assert SchedulerLease.objects.get().epoch == 1
    leadership.release(lease)
    # Handed back: a renewal that lands late must not take it again.
    assert leadership.renew(lease, 30.0) is False
    row = SchedulerLease.objects.get()
    assert row.released
    second = in_another_process(lambda: leadership.acquire(LEASE_S))
    assert second.epoch == 2
    assert leadership.renew(lease, 30.0) is False  # superseded: never renewed, never re-taken
    assert SchedulerLease.objects.values_list("holder", "epoch").get() == (second.holder, 2)
    assert not Job.objects.exists()
