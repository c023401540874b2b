"""Gangs and topology: all GPUs at once or none; one node, then fewest nodes, then one rack, scored
by the ring all-reduce cost model; torchrun rendezvous; bounded reservations against starvation."""

import pytest

from jobs.scheduling import SchedulerConfig, decide
from jobs.scheduling.topology import allreduce_seconds
from tests.scheduling.builders import cluster, codes, job, node, nodes, pending_of, placed, running, tenant

TEAM = [tenant("team", guaranteed=64)]
WINDOW = SchedulerConfig().gang_reservation_max_s
# Jobs submitted at t=1 are past their wait for one node by then, so spreading is allowed.
PAST_ONE_NODE_WAIT = SchedulerConfig().gang_single_node_wait_s + 1


def place_of(decisions, job_id):
    return next(p for p in decisions.placements if p.job_id == job_id)


@pytest.mark.parametrize("gpus, bytes_, gb_per_s, expected", [
    (1, 10**9, 25.0, 0.0),
    (2, 10**9, 25.0, 2 * 1 / 2 * 1e9 / 25e9),
    (8, 10**9, 300.0, 2 * 7 / 8 * 1e9 / 300e9),
])
def test_ring_allreduce_cost(gpus, bytes_, gb_per_s, expected):
    assert allreduce_seconds(gpus, bytes_, gb_per_s) == pytest.approx(expected)


def test_gang_prefers_one_node_even_when_spreading_would_fit_sooner():
    snapshot = cluster(node("a", gpus=8, busy=4), node("b", gpus=8, busy=4), node("c", gpus=8), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=8)])
    (place,) = decide(snapshot, now=0).placements
    assert place.nodes == ("c",)


def test_gang_prefers_the_faster_link_among_nodes_that_fit():
    snapshot = cluster(node("pcie", gpus=8, busy=4, gb_per_s=32.0), node("nvlink", gpus=8, gb_per_s=300.0),
                       tenants=TEAM, pending=[job(1, tenant="team", gpus=4)])
    place = place_of(decide(snapshot, now=0), 1)
    assert place.nodes == ("nvlink",)
    assert place.allreduce_s == pytest.approx(allreduce_seconds(4, SchedulerConfig().default_allreduce_bytes, 300.0))


def test_one_gpu_jobs_ignore_link_speed_and_fill_the_fullest_node():
    snapshot = cluster(node("pcie", gpus=8, busy=4, gb_per_s=32.0), node("nvlink", gpus=8, gb_per_s=300.0),
                       tenants=TEAM, pending=[job(1, tenant="team")])
    assert placed(decide(snapshot, now=0)) == {1: "pcie"}


@pytest.mark.parametrize("layout, gpus, expected_nodes", [
    # (node name, rack, free GPUs)
    ([("a", "r1", 8), ("b", "r1", 8)], 16, {"a", "b"}),
    ([("a", "r1", 4), ("b", "r1", 4), ("c", "r2", 8), ("d", "r3", 4)], 12, {"c", "a"}),  # fewest nodes first
    ([("a", "r1", 8), ("b", "r2", 4), ("c", "r1", 4)], 12, {"a", "c"}),                  # then one rack
    ([("a", "r1", 8), ("b", "r1", 2), ("c", "r1", 6)], 10, {"a", "b"}),                  # tightest last node
])
def test_gang_spans_fewest_nodes_then_one_rack(layout, gpus, expected_nodes):
    node_states = [node(name, gpus=8, busy=8 - free, rack=rack) for name, rack, free in layout]
    snapshot = cluster(*node_states, tenants=TEAM, pending=[job(1, tenant="team", gpus=gpus)])
    assert set(place_of(decide(snapshot, now=0), 1).nodes) == expected_nodes


def test_multi_node_placement_carries_torchrun_rendezvous():
    snapshot = cluster(node("a", gpus=8, busy=2), node("b", gpus=8), tenants=TEAM,
                       pending=[job(7, tenant="team", gpus=12)])
    place = place_of(decide(snapshot, now=0), 7)
    rendezvous = place.rendezvous
    assert (rendezvous.master_node, rendezvous.world_size, rendezvous.nnodes) == ("b", 12, 2)
    assert rendezvous.master_port == SchedulerConfig().rendezvous_port_base + 7
    first, second = place.slices
    assert (first.node, first.node_rank, first.first_rank, len(first.gpu_ids)) == ("b", 0, 0, 8)
    assert (second.node, second.node_rank, second.first_rank, len(second.gpu_ids)) == ("a", 1, 8, 4)
    env = rendezvous.env(second, local_rank=3)
    assert env == {"MASTER_ADDR": "b", "MASTER_PORT": str(rendezvous.master_port), "WORLD_SIZE": "12", "RANK": "11",
                   "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1", "NNODES": "2"}
    with pytest.raises(ValueError):
        place.gpu_indices  # noqa: B018 - a multi-node placement must be read per slice


def test_single_gpu_job_has_no_rendezvous_and_a_gang_on_one_node_has_one():
    snapshot = cluster(node("a", gpus=8), tenants=TEAM, pending=[job(1, tenant="team"), job(2, tenant="team", gpus=4)])
    decisions = decide(snapshot, now=0)
    assert place_of(decisions, 1).rendezvous is None
    assert place_of(decisions, 2).rendezvous.world_size == 4


@pytest.mark.parametrize("free, gpus, max_nodes, placed_ok, code", [
    ([4, 4], 8, None, True, None),
    ([4, 4], 8, 1, False, "holding_reservation"),
    ([4, 4, 4], 12, 2, False, "holding_reservation"),
    ([8], 16, 1, False, "gang_larger_than_any_node"),
    ([8, 8], 24, None, False, "gang_larger_than_cluster"),
])
def test_gang_gets_all_gpus_at_once_or_waits(free, gpus, max_nodes, placed_ok, code):
    node_states = [node(f"n{i}", gpus=8, busy=8 - f) for i, f in enumerate(free)]
    snapshot = cluster(*node_states, tenants=TEAM, pending=[job(1, tenant="team", gpus=gpus, max_nodes=max_nodes)])
    decisions = decide(snapshot, now=PAST_ONE_NODE_WAIT)
    if placed_ok:
        assert sum(len(p.gpu_ids) for p in decisions.placements) == gpus
    else:
        assert decisions.placements == () and codes(decisions) == {1: code}


# -- reservations --------------------------------------------------------------------------------

def starving_gang(**gang):
    """Node a has 4 of 8 GPUs free (the rest end at t=100); the gang needs all 8."""
    return cluster(
        node("a", gpus=8), tenants=[tenant("big"), tenant("small")],
        running=[running(50 + i, on="a", gpus=[i], tenant="small", opportunistic=True, runtime=100) for i in range(4)],
        pending=[job(1, tenant="big", gpus=8, submitted_at=1, **gang), job(2, tenant="small", submitted_at=2),
                 job(3, tenant="small", submitted_at=3, runtime=30),
                 job(4, tenant="small", submitted_at=4, runtime=90)])


def test_blocked_gang_holds_its_best_node_and_small_jobs_do_not_take_it():
    decisions = decide(starving_gang(), now=20)
    (reservation,) = decisions.reservations
    assert (reservation.job_id, reservation.nodes) == (1, ("a",))
    assert (reservation.since, reservation.until, reservation.eta_s) == (20, 20 + WINDOW, 80)
    assert codes(decisions)[1] == "holding_reservation"
    assert codes(decisions)[2] == "reserved_for_gang"
    assert pending_of(decisions, 1).eta_at == 20 + 80


def test_jobs_that_end_before_the_gang_could_start_backfill_the_held_node():
    decisions = decide(starving_gang(), now=20)
    assert placed(decisions) == {3: "a"}  # ends at 50; job 4 would end at 110, after the gang's ETA of 100
    assert codes(decisions)[4] == "reserved_for_gang"


@pytest.mark.parametrize("reserved_since, now, holds, since", [
    (None, 20, True, 20),
    (0, 20, True, 0),                     # inside its window: keeps the original start
    (0, WINDOW + 1, False, None),         # window over: cools down as long again
    (0, 2 * WINDOW + 1, True, 2 * WINDOW + 1),  # then may hold again, with a new window
])
def test_reservation_is_bounded_in_time(reserved_since, now, holds, since):
    decisions = decide(starving_gang(reserved_since=reserved_since), now=now)
    if holds:
        assert [(r.job_id, r.since) for r in decisions.reservations] == [(1, since)]
    else:
        assert decisions.reservations == ()
        assert placed(decisions).keys() >= {2, 3, 4}  # small jobs backfill freely while it cools down


def test_a_window_of_zero_switches_reservations_off():
    decisions = decide(starving_gang(), now=20, config=SchedulerConfig(gang_reservation_max_s=0))
    assert decisions.reservations == ()
    assert codes(decisions)[1] != "holding_reservation"
    assert placed(decisions).keys() >= {2, 3, 4}  # nothing holds the node: the small jobs take it


def test_only_one_gang_holds_a_reservation_per_cycle():
    snapshot = cluster(node("a", gpus=8, busy=4), node("b", gpus=8, busy=4), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=8, max_nodes=1), job(2, tenant="team", gpus=8, max_nodes=1)])
    decisions = decide(snapshot, now=0)
    assert [r.job_id for r in decisions.reservations] == [1]
    # Job 2 would not fit on the held node either, so it is simply waiting.
    assert codes(decisions) == {1: "holding_reservation", 2: "waiting_for_free_gpus"}


def test_guaranteed_gang_that_can_reclaim_does_not_hold():
    snapshot = cluster(node("a", gpus=8), tenants=[tenant("owner", guaranteed=8), tenant("borrower")],
                       running=[running(50 + i, on="a", gpus=[i], tenant="borrower", opportunistic=True)
                                for i in range(4)],
                       pending=[job(1, tenant="owner", gpus=8)])
    decisions = decide(snapshot, now=0)
    assert decisions.reservations == ()
    assert codes(decisions) == {1: "reclaiming"} and len(decisions.preemptions) == 4


def test_spread_gang_reserves_nodes_with_most_free_gpus():
    snapshot = cluster(*nodes(4, gpus=8, busy=5), tenants=TEAM, pending=[job(1, tenant="team", gpus=16)])
    decisions = decide(snapshot, now=0)
    assert len(decisions.reservations[0].nodes) == 2  # 8 + 8 GPUs of 2 nodes cover 16


def test_a_gang_never_mixes_gpu_models():
    """Ranks move in lockstep: 6 V100s and 2 A100s would run at V100 speed and strand the A100s."""
    mixed_free = cluster(node("v", gpus=8, busy=2, model="V100-32GB", mem_gib=32), node("a", gpus=8, busy=6),
                         tenants=TEAM, pending=[job(1, tenant="team", gpus=8)])
    assert placed(decide(mixed_free, now=0)) == {}
    with_a_second_a100_node = cluster(node("v", gpus=8, busy=2, model="V100-32GB", mem_gib=32),
                                      node("a1", gpus=8, busy=4), node("a2", gpus=8, busy=4),
                                      tenants=TEAM, pending=[job(1, tenant="team", gpus=8)])
    assert set(place_of(decide(with_a_second_a100_node, now=PAST_ONE_NODE_WAIT), 1).nodes) == {"a1", "a2"}


def test_a_gang_on_a_node_with_two_models_takes_one_model_and_says_so_when_it_cannot():
    from dataclasses import replace

    mixed = node("m", gpus=8)
    mixed = replace(mixed, gpus=tuple(replace(g, model="V100-32GB", memory_mib=32 * 1024) if g.index >= 4 else g
                                      for g in mixed.gpus))
    four = cluster(mixed, tenants=TEAM, pending=[job(1, tenant="team", gpus=4)])
    place = place_of(decide(four, now=0), 1)
    assert len({g.model for g in four.nodes[0].gpus if g.id in place.gpu_ids}) == 1
    six = decide(cluster(mixed, tenants=TEAM, pending=[job(2, tenant="team", gpus=6)]), now=0)
    assert placed(six) == {}
    reason = pending_of(six, 2).reason
    assert "of one model" in reason.message and reason.details["cluster_gpus"] == 4
