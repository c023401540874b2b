"""Turnover among borrowers: a borrower with little service that could only over-commit a GPU
preempts instead a borrower served past ``borrower_turnover_gpu_s`` that checkpoints."""

import dataclasses
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs.scheduling import PreemptReason, decide
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.turnover import _MostServed
from tests.scheduling.builders import cluster, codes, job, node, placed, preempted, running, tenant
from tests.scheduling.test_invariants import warm_clusters

BORROWERS = [tenant("old", guaranteed=0, max_gpus=8), tenant("new", guaranteed=0, max_gpus=8)]
HOUR = 3600.0


def half_busy_gpu(**victim):
    """One GPU, a borrower of ``old`` on it using half of it (room to over-commit), and a fresh
    whole-GPU borrower of ``new`` waiting."""
    spec = dict(on="a", gpus=[0], tenant="old", opportunistic=True, util=0.5, solo=0.5, checkpoints=True, mem_gib=20,
                started_at=0.0)
    spec.update(victim)
    return cluster(node("a", gpus=1, util=0.5), tenants=BORROWERS, running=[running(9, **spec)],
                   pending=[job(1, tenant="new", mem_gib=20)])


def test_a_fresh_borrower_preempts_the_most_served_checkpointing_borrower_instead_of_sharing_its_gpu():
    decisions = decide(half_busy_gpu(), now=2 * HOUR)
    assert preempted(decisions) == [9]
    (preempt,) = decisions.preemptions
    assert (preempt.reason, preempt.for_job_id) == (PreemptReason.LEAST_ATTAINED, 1)
    assert codes(decisions) == {1: "reclaiming"}
    assert "least served" in decisions.pending[0].reason.message


def test_without_turnover_the_fresh_borrower_over_commits_the_gpu():
    config = dataclasses.replace(SchedulerConfig(), borrower_turnover_gpu_s=0)
    decisions = decide(half_busy_gpu(), now=2 * HOUR, config=config)
    assert not decisions.preemptions and placed(decisions) == {1: "a"}


@pytest.mark.parametrize("victim", [
    dict(checkpoints=False),  # would lose its run
    dict(started_at=1.5 * HOUR),  # half an hour of service: in the first queue itself
    dict(opportunistic=False, tenant="old"),  # guaranteed work is never a victim
])
def test_no_turnover_where_the_running_job_is_not_fair_game(victim):
    tenants = BORROWERS if victim.get("opportunistic", True) else [
        tenant("old", guaranteed=1, max_gpus=8), tenant("new", guaranteed=0, max_gpus=8)]
    snapshot = half_busy_gpu(**victim)
    if not victim.get("opportunistic", True):
        snapshot = dataclasses.replace(snapshot, tenants=tuple(tenants))
    decisions = decide(snapshot, now=2 * HOUR)
    assert not [p for p in decisions.preemptions if p.reason is PreemptReason.LEAST_ATTAINED]


def test_a_borrower_served_past_the_threshold_itself_shares_rather_than_preempts():
    snapshot = half_busy_gpu()
    snapshot = dataclasses.replace(snapshot,
                                   pending=(dataclasses.replace(snapshot.pending[0], attained_gpu_s=2 * HOUR),))
    decisions = decide(snapshot, now=2 * HOUR)
    assert not decisions.preemptions and placed(decisions) == {1: "a"}


def full_gpu(**victim):
    """One GPU whose memory a borrower of ``old`` fills (no room to over-commit), and a fresh
    borrower of ``new`` waiting."""
    spec = dict(on="a", gpus=[0], tenant="old", opportunistic=True, util=0.5, solo=0.5, checkpoints=True, mem_gib=70,
                started_at=0.0)
    spec.update(victim)
    return cluster(node("a", gpus=1, util=0.5), tenants=BORROWERS, running=[running(9, **spec)],
                   pending=[job(1, tenant="new", mem_gib=20)])


def test_a_fresh_borrower_that_finds_no_room_at_all_preempts_the_most_served_borrower():
    decisions = decide(full_gpu(), now=2 * HOUR)
    assert preempted(decisions) == [9]
    assert decisions.preemptions[0].reason is PreemptReason.LEAST_ATTAINED
    assert codes(decisions) == {1: "reclaiming"}


def test_without_turnover_when_blocked_the_fresh_borrower_waits():
    config = dataclasses.replace(SchedulerConfig(), turnover_when_blocked=False)
    decisions = decide(full_gpu(), now=2 * HOUR, config=config)
    assert not decisions.preemptions and 1 not in placed(decisions)


def crowded(**borrower):
    """A guaranteed job and a throttled borrower on GPU 0 of a node whose GPU 1 is empty."""
    spec = dict(on="a", gpus=[0], tenant="old", opportunistic=True, util=0.05, solo=0.5, duty=0.1,
                checkpoints=True, mem_gib=20, started_at=0.0)
    spec.update(borrower)
    return cluster(node("a", gpus=2, util={0: 0.95, 1: 0.0}),
                   tenants=[tenant("owner", guaranteed=1, max_gpus=8), tenant("old", guaranteed=0, max_gpus=8)],
                   running=[running(5, on="a", gpus=[0], tenant="owner", util=0.9, solo=0.9, mem_gib=20),
                            running(9, **spec)])


def test_a_crowded_borrower_moves_to_a_gpu_left_empty():
    decisions = decide(crowded(), now=HOUR)
    assert preempted(decisions) == [9]
    assert decisions.preemptions[0].reason is PreemptReason.MOVE_TO_EMPTY_GPU
    assert 9 not in {t.job_id for t in decisions.throttles}


@pytest.mark.parametrize("change", [
    dict(borrower=dict(checkpoints=False)),  # would lose its run
    dict(config=dict(move_crowded_borrowers=False)),
])
def test_no_move_for_a_borrower_that_would_lose_its_work_or_when_switched_off(change):
    config = dataclasses.replace(SchedulerConfig(), **change.get("config", {}))
    decisions = decide(crowded(**change.get("borrower", {})), now=HOUR, config=config)
    assert not decisions.preemptions


def test_no_move_while_someone_queued_takes_the_empty_gpu():
    snapshot = dataclasses.replace(crowded(), pending=(job(1, tenant="old", mem_gib=20),))
    decisions = decide(snapshot, now=HOUR)
    assert placed(decisions) == {1: "a"} and not decisions.preemptions


def two_served_borrowers():
    """Two GPUs, each with a checkpointing borrower of ``old`` using half of it: job 8 ran 1.5 h
    in all, job 9 ran 3 h this run after 10 h in earlier ones; a fresh borrower of ``new`` waits."""
    now = 20 * HOUR
    spec = dict(on="a", tenant="old", opportunistic=True, util=0.5, solo=0.5, checkpoints=True, mem_gib=20)
    return now, cluster(node("a", gpus=2, util=0.5), tenants=BORROWERS,
                        running=[running(8, gpus=[0], started_at=now - 1.5 * HOUR, **spec),
                                 running(9, gpus=[1], started_at=now - 3 * HOUR, attained=10 * HOUR, **spec)],
                        pending=[job(1, tenant="new", mem_gib=20)])


def test_turnover_preempts_the_borrower_with_the_most_service_in_all_as_las_does():
    now, snapshot = two_served_borrowers()
    assert preempted(decide(snapshot, now=now)) == [9]


def test_without_most_served_first_turnover_preempts_the_borrower_with_the_shortest_current_run():
    now, snapshot = two_served_borrowers()
    config = dataclasses.replace(SchedulerConfig(), turnover_most_served_first=False)
    assert preempted(decide(snapshot, now=now, config=config)) == [8]


def with_served(snapshot, **served_h):
    """``snapshot`` with the running jobs' service in this run as the loop measured it (hours)."""
    served = {int(job_id[1:]): hours * HOUR for job_id, hours in served_h.items()}
    return dataclasses.replace(snapshot, readings=dataclasses.replace(snapshot.readings, served_gpu_s=served))


def test_a_borrower_that_held_its_gpu_two_hours_at_a_quarter_speed_is_not_turned_over():
    # Two hours held, half an hour of work done: turnover counts what it had, not how long it sat.
    decisions = decide(with_served(half_busy_gpu(), j9=0.5), now=2 * HOUR)
    assert not decisions.preemptions and placed(decisions) == {1: "a"}
    assert preempted(decide(with_served(half_busy_gpu(), j9=1.5), now=2 * HOUR)) == [9]


def test_turnover_takes_the_borrower_that_had_the_most_service_not_the_one_that_held_its_gpu_longest():
    now, snapshot = two_served_borrowers()  # (job 9: 3 h held this run after 10 h before; job 8: 1.5 h)
    assert preempted(decide(with_served(snapshot, j8=1.5, j9=0.2), now=now)) == [9]  # (10.2 h against 1.5)
    snapshot = dataclasses.replace(snapshot, running=tuple(
        dataclasses.replace(r, attained_gpu_s=0.0) for r in snapshot.running))
    assert preempted(decide(with_served(snapshot, j8=1.5, j9=1.2), now=now)) == [8]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(warm_clusters(), st.data())
def test_turnover_skips_only_nodes_that_offer_it_nothing(snapshot, data):
    """A turnover asks only the nodes with an empty GPU or a resident it could take
    (``_MostServed._may_have_open_gpus``): the decisions are those of asking every node."""
    running = tuple(dataclasses.replace(j, checkpoints=data.draw(st.booleans()),
                                        attained_gpu_s=data.draw(st.sampled_from([0.0, 200.0, 5000.0])))
                    for j in snapshot.running)
    snapshot = dataclasses.replace(snapshot, running=running)
    config = dataclasses.replace(SchedulerConfig(), borrower_turnover_gpu_s=300)
    decisions = decide(snapshot, now=1000.0, config=config)
    every_node = lambda self: {node.key for node in self.capacity.nodes}  # noqa: E731
    with mock.patch.object(_MostServed, "_may_have_open_gpus", every_node):
        assert decide(snapshot, now=1000.0, config=config) == decisions
    event("turns over" if any(p.reason is PreemptReason.LEAST_ATTAINED for p in decisions.preemptions)
          else "no turnover")
