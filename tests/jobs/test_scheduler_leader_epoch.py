"""The scheduler's leader epoch moves only on a real takeover (issue 38): the leader keeps its
lease between cycles, so a standby process whose tick comes between two of them runs nothing and
moves no epoch; the epoch moves when the lease expired under another holder, and a warm shutdown
hands the lease back so a standby need not wait for it to expire.

"Another scheduler process" is a thread with its own connection and holder id, as in
test_leadership.py."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from jobs.models import SchedulerLease
from jobs.services import leadership
from jobs.services import scheduling_loop
from jobs.services.scheduling_loop import STATS_KEY, hand_back_on_shutdown, run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory
from tests.jobs.test_leadership import in_another_process


@pytest.fixture
def online_node(transactional_db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=30)
    yield node
    scheduling_loop._held.lease = None


def metrics(client):
    return {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}


def test_the_leader_keeps_its_lease_between_cycles_and_a_standby_moves_no_epoch(online_node, client, redis_client):
    JobFactory(gpus=1)
    assert run_scheduling_cycle().placed == 1
    lease = SchedulerLease.objects.get()
    assert (lease.holder, lease.epoch, lease.released) == (leadership.holder_id(), 1, False)
    assert lease.expires_at > timezone.now()  # held between cycles, not handed back

    # The standby's tick lands between the leader's cycles: it runs nothing, takes nothing.
    standby = in_another_process(run_scheduling_cycle)
    assert standby.ran is False
    assert in_another_process(lambda: leadership.acquire(30.0)) is None

    assert run_scheduling_cycle().ran
    assert SchedulerLease.objects.values_list("holder", "epoch").get() == (leadership.holder_id(), 1)
    families = metrics(client)
    assert families["colony_scheduler_leader_epoch"].samples[0].value == 1
    (leader,) = families["colony_scheduler_leader"].samples
    assert leader.labels == {"holder": leadership.holder_id()} and leader.value == 1  # held now
    assert not redis_client.hget(STATS_KEY, "takeovers")


def test_an_expired_lease_is_taken_over_by_another_process_and_the_epoch_moves(online_node, redis_client):
    assert run_scheduling_cycle().ran
    leader = SchedulerLease.objects.get().holder
    # The leader stopped ticking (killed, stopped) for longer than its lease.
    SchedulerLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    scheduling_loop._held.lease = None  # that process is gone: nothing of it hands anything back

    assert in_another_process(run_scheduling_cycle).ran
    row = SchedulerLease.objects.get()
    assert row.epoch == 2 and row.holder != leader and not row.released
    assert redis_client.hget(STATS_KEY, "takeovers") == b"1"


def test_a_warm_shutdown_hands_the_lease_back_and_the_standby_takes_it_at_once(online_node, redis_client):
    assert run_scheduling_cycle().ran
    hand_back_on_shutdown()
    assert SchedulerLease.objects.get().released

    assert in_another_process(run_scheduling_cycle).ran  # no wait for the lease to run out
    assert SchedulerLease.objects.get().epoch == 2
    assert not redis_client.hget(STATS_KEY, "takeovers")  # handed over, not taken over


def test_a_cycle_that_fails_hands_its_lease_back(online_node, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the core")

    monkeypatch.setattr(scheduling_loop, "decide", broken)
    with pytest.raises(RuntimeError):
        run_scheduling_cycle()
    assert SchedulerLease.objects.get().released
