"""The researcher's contract in the core: checkpointing victims first, job-array caps,
dependencies, container-runtime nodes, and a bounded wait for one node before a gang is spread."""

import pytest

from jobs.scheduling import ReasonCode, SchedulerConfig, decide
from tests.scheduling.builders import cluster, codes, job, node, pending_of, placed, preempted, running, tenant

OWNER_AND_BORROWER = [tenant("owner", guaranteed=4, max_gpus=4), tenant("borrower", guaranteed=0, max_gpus=8)]
TEAM = [tenant("team", guaranteed=64)]
WAIT = SchedulerConfig().gang_single_node_wait_s


# -- victims: jobs that checkpoint go first ----------------------------------------------------------

@pytest.mark.parametrize("checkpoints, victim", [
    ({10: False, 11: False}, 11),  # nobody checkpoints: youngest first, as before
    ({10: True, 11: False}, 10),   # the older one checkpoints: it loses little, it goes
    ({10: True, 11: True}, 11),    # both do: youngest first again
])
def test_reclaim_prefers_a_victim_that_checkpoints(checkpoints, victim):
    snapshot = cluster(node("a", gpus=2), tenants=OWNER_AND_BORROWER,
                       running=[running(i, on="a", gpus=[i - 10], tenant="borrower", opportunistic=True,
                                        started_at={10: 50.0, 11: 90.0}[i], checkpoints=c)
                                for i, c in checkpoints.items()],
                       pending=[job(1, tenant="owner")])
    assert preempted(decide(snapshot, now=100)) == [victim]


def test_reclaim_prefers_the_node_whose_victims_checkpoint():
    """Node old's job ran longer but checkpoints; node young's job would lose all its work."""
    snapshot = cluster(node("old", gpus=2), node("young", gpus=2), tenants=OWNER_AND_BORROWER,
                       running=[running(10, on="old", gpus=[0, 1], tenant="borrower", opportunistic=True, started_at=0,
                                        checkpoints=True),
                                running(11, on="young", gpus=[0], tenant="borrower", opportunistic=True,
                                        started_at=90)],
                       pending=[job(1, tenant="owner", gpus=2)])
    assert preempted(decide(snapshot, now=100)) == [10]


def test_memory_pressure_sheds_a_checkpointing_borrower_first():
    snapshot = cluster(node("a", gpus=1, mem_gib=80), tenants=OWNER_AND_BORROWER,
                       running=[running(1, tenant="owner", mem_gib=60),
                                running(10, tenant="borrower", opportunistic=True, mem_gib=10, started_at=0,
                                        checkpoints=True),
                                running(11, tenant="borrower", opportunistic=True, mem_gib=10, started_at=50)])
    assert preempted(decide(snapshot, now=100)) == [10]


# -- job arrays ----------------------------------------------------------------------------------------

def test_an_array_never_runs_more_than_its_limit():
    snapshot = cluster(node("a", gpus=8), tenants=TEAM,
                       running=[running(50, gpus=[0], tenant="team", array=7)],
                       pending=[job(i, tenant="team", array=(7, 3)) for i in range(1, 6)])
    decisions = decide(snapshot, now=10)
    assert sorted(placed(decisions)) == [1, 2]  # 1 running + 2 placed = 3
    assert codes(decisions) == {3: "array_limit", 4: "array_limit", 5: "array_limit"}
    reason = pending_of(decisions, 3).reason
    assert reason.message.startswith("3 of array 7's jobs are running (at most 3 at once)")
    assert reason.details == {"array_id": 7, "running": 3, "max_running": 3}


def test_array_limit_counts_stopping_jobs_and_spares_other_arrays_and_jobs():
    snapshot = cluster(node("a", gpus=8), tenants=TEAM,
                       running=[running(50, gpus=[0], tenant="team", array=7, preempting=True)],
                       pending=[job(1, tenant="team", array=(7, 1)), job(2, tenant="team", array=(8, 1)),
                                job(3, tenant="team")])
    decisions = decide(snapshot, now=10)
    assert sorted(placed(decisions)) == [2, 3]
    assert codes(decisions) == {1: "array_limit"}


def test_array_limit_eta_comes_from_the_arrays_own_expected_ends():
    snapshot = cluster(node("a", gpus=8), tenants=[tenant("team", guaranteed=0)],
                       running=[running(50, gpus=[0], tenant="team", array=7, opportunistic=True, started_at=0,
                                        runtime=100),
                                running(51, gpus=[1], tenant="team", array=7, opportunistic=True, started_at=0)],
                       pending=[job(1, tenant="team", array=(7, 2)), job(2, tenant="team", array=(7, 2))])
    decisions = decide(snapshot, now=40)
    assert pending_of(decisions, 1).eta_at == 100.0  # job 50 is expected to end then
    assert pending_of(decisions, 1).eta_s(40) == 60.0
    assert pending_of(decisions, 2).eta_at is None  # needs job 51 too, whose end is unknown


# -- dependencies ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("waiting_for, message", [
    (((41, "ok"),), "Waiting for job 41 to succeed."),
    (((41, "any"),), "Waiting for job 41 to end."),
    (((41, "ok"), (42, "any"), (43, "ok")), "Waiting for job 41 to succeed and for 2 other jobs it depends on."),
])
def test_a_job_waiting_for_dependencies_is_never_placed_and_says_on_what(waiting_for, message):
    snapshot = cluster(node("a", gpus=8), tenants=TEAM, pending=[job(1, tenant="team", waiting_for=waiting_for)])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {}
    (pending,) = decisions.pending
    assert pending.reason.code is ReasonCode.WAITING_FOR_DEPENDENCY
    assert pending.reason.message == message
    assert pending.reason.details["waiting_for"][0] == {"job": 41, "kind": waiting_for[0][1]}


def test_a_waiting_gang_holds_nothing_and_blocks_nobody():
    """First in line and too big to fit now: were it in the queue it would hold node a."""
    snapshot = cluster(node("a", gpus=8, busy=4), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=8, waiting_for=((41, "ok"),)),
                                job(2, tenant="team", gpus=2)])
    decisions = decide(snapshot, now=10)
    assert decisions.reservations == ()
    assert placed(decisions) == {2: "a"}
    assert codes(decisions) == {1: "waiting_for_dependency"}


# -- container runtimes ----------------------------------------------------------------------------------

def test_an_image_job_runs_only_on_a_node_with_a_container_runtime():
    snapshot = cluster(node("plain", gpus=8), node("docker", gpus=8, busy=7, runtimes=("docker",)), tenants=TEAM,
                       pending=[job(1, tenant="team", image=True), job(2, tenant="team", image=True),
                                job(3, tenant="team")])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {1: "docker", 3: "plain"}
    assert codes(decisions) == {2: "waiting_for_free_gpus"}


def test_with_no_runtime_anywhere_an_image_job_is_told_so():
    snapshot = cluster(node("a", gpus=8), tenants=TEAM, pending=[job(1, tenant="team", image=True)])
    (pending,) = decide(snapshot, now=10).pending
    assert pending.reason.code is ReasonCode.NEEDS_CONTAINER_RUNTIME
    assert pending.reason.message.startswith("No node runs containers;")
    assert pending.reason.details == {"runtime_nodes": [], "needed_gpus": 1}


def test_an_image_job_too_wide_for_the_runtime_nodes_names_them():
    snapshot = cluster(node("a", gpus=8), node("b", gpus=2, runtimes=("podman",)), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=4, image=True)])
    (pending,) = decide(snapshot, now=10).pending
    assert pending.reason.code is ReasonCode.NEEDS_CONTAINER_RUNTIME
    assert pending.reason.details["runtime_nodes"] == ["b"]
    assert "(b)" in pending.reason.message


def test_an_impossible_image_job_is_told_what_is_impossible_first():
    snapshot = cluster(node("a", gpus=8), tenants=TEAM, pending=[job(1, tenant="team", models=("H100",), image=True)])
    assert codes(decide(snapshot, now=10)) == {1: "gpu_model_unavailable"}


def test_an_image_job_fitting_only_a_cordoned_runtime_node_is_told_about_the_cordon():
    snapshot = cluster(node("a", gpus=8), node("c", gpus=8, cordoned=True, runtimes=("apptainer",)), tenants=TEAM,
                       pending=[job(1, tenant="team", image=True)])
    (pending,) = decide(snapshot, now=10).pending
    assert pending.reason.code is ReasonCode.NEEDS_CORDONED_NODES
    assert pending.reason.details["cordoned"] == ["c"]


# -- gangs: one node if waiting a bounded time allows it ----------------------------------------------------

def three_half_free_nodes(submitted_at: float, **gang):
    return cluster(node("a", gpus=8, busy=5), node("b", gpus=8, busy=5), node("c", gpus=8, busy=5), tenants=TEAM,
                   pending=[job(1, tenant="team", gpus=8, submitted_at=submitted_at, **gang)])


def test_a_young_gang_waits_for_one_node_rather_than_spreading():
    decisions = decide(three_half_free_nodes(submitted_at=100), now=160)
    assert placed(decisions) == {}
    (pending,) = decisions.pending
    assert pending.reason.code is ReasonCode.WAITING_FOR_ONE_NODE
    assert pending.reason.message.startswith(
        "Waiting up to 5 min after submission for one node with 8 free GPUs rather than spreading it over 3 nodes")
    assert pending.eta_at == pytest.approx(400.0)  # spread at the latest then
    assert decisions.reservations == ()


def test_after_the_wait_the_gang_is_spread_and_the_note_says_why():
    decisions = decide(three_half_free_nodes(submitted_at=100), now=100 + WAIT)
    (place,) = decisions.placements
    assert len(place.slices) == 3
    assert place.note == "Spread over 3 nodes (a, b, c) after waiting 5 min for one node with 8 free GPUs."


def test_a_gang_no_node_could_hold_is_spread_at_once_and_says_why():
    snapshot = cluster(node("a", gpus=8), node("b", gpus=8), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=12, submitted_at=100)])
    (place,) = decide(snapshot, now=101).placements
    assert place.note == "Spread over 2 nodes (a, b): no node has 12 GPUs of one model that fit it."


def test_waiting_for_one_node_can_be_switched_off():
    config = SchedulerConfig(gang_single_node_wait_s=0)
    (place,) = decide(three_half_free_nodes(submitted_at=100), now=101, config=config).placements
    assert len(place.slices) == 3 and "switched off" in place.note


def test_a_node_with_room_is_taken_at_once_and_noted():
    snapshot = cluster(node("a", gpus=8, busy=5), node("b", gpus=8), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=8, submitted_at=100),
                                job(2, tenant="team", submitted_at=101)])
    decisions = decide(snapshot, now=101)
    notes = {p.job_id: p.note for p in decisions.placements}
    assert notes[1] == "On one node (b)."
    assert notes[2] == "On a, GPU 5."


def test_a_waiting_gang_does_not_stop_smaller_jobs():
    snapshot = cluster(node("a", gpus=8, busy=5), node("b", gpus=8, busy=5), node("c", gpus=8, busy=5), tenants=TEAM,
                       pending=[job(1, tenant="team", gpus=8, submitted_at=100),
                                job(2, tenant="team", gpus=2, submitted_at=101)])
    decisions = decide(snapshot, now=110)
    assert codes(decisions) == {1: "waiting_for_one_node"}
    assert 2 in placed(decisions)


def test_a_shared_gpu_placement_says_who_it_shares_with():
    snapshot = cluster(node("a", gpus=1), tenants=[tenant("owner", guaranteed=1), tenant("borrower")],
                       running=[running(9, tenant="owner", mem_gib=10, util=0.3)],
                       pending=[job(1, tenant="borrower", mem_gib=10)])
    (place,) = decide(snapshot, now=10).placements
    assert place.note == "On a, GPU 0, sharing it with 1 running job."
