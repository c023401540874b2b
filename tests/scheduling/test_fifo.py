"""The baseline policy: whole GPUs, one node per job, priority then submit order, best fit."""

import pytest

from jobs.scheduling import ReasonCode
from jobs.scheduling.policies import fifo_exclusive
from tests.scheduling.builders import cluster, job, node, running


def placed_nodes(decisions) -> dict[int, str]:
    return {p.job_id: p.node for p in decisions.placements}


def reasons(decisions) -> dict[int, ReasonCode]:
    return {p.job_id: p.reason.code for p in decisions.pending}


def test_job_gets_distinct_free_gpus_on_one_node():
    snapshot = cluster(node("a", gpus=4, busy=1), pending=[job(1, gpus=3)])
    (place,) = fifo_exclusive(snapshot, now=0).placements
    assert place.node == "a"
    assert sorted(place.gpu_indices) == [1, 2, 3]  # GPU 0 is busy


def test_gpu_of_a_running_job_is_not_free():
    snapshot = cluster(node("a", gpus=2), running=[running(9, on="a", gpus=[0], mem_gib=1)], pending=[job(1)])
    (place,) = fifo_exclusive(snapshot, now=0).placements
    assert place.gpu_indices == (1,)


def test_jobs_in_one_cycle_never_share_a_gpu():
    snapshot = cluster(node("a", gpus=4), pending=[job(i, gpus=1) for i in range(1, 7)])
    decisions = fifo_exclusive(snapshot, now=0)
    gpus = [g for p in decisions.placements for g in p.gpu_ids]
    assert len(gpus) == len(set(gpus)) == 4
    assert set(reasons(decisions).values()) == {ReasonCode.WAITING_FOR_FREE_GPUS}


def test_best_fit_prefers_the_fullest_node_that_fits():
    snapshot = cluster(node("empty", gpus=8), node("half", gpus=8, busy=6), pending=[job(1, gpus=2)])
    assert placed_nodes(fifo_exclusive(snapshot, now=0)) == {1: "half"}


def test_earlier_submission_wins_then_higher_priority_jumps_ahead():
    fifo = cluster(node("a", gpus=1), pending=[job(2, submitted_at=20), job(1, submitted_at=10)])
    assert placed_nodes(fifo_exclusive(fifo, now=0)) == {1: "a"}
    urgent = cluster(node("a", gpus=1), pending=[job(1, submitted_at=10), job(2, submitted_at=20, priority=5)])
    assert placed_nodes(fifo_exclusive(urgent, now=0)) == {2: "a"}


def test_small_job_runs_past_a_large_one_that_does_not_fit():
    snapshot = cluster(node("a", gpus=8, busy=6), pending=[job(1, gpus=4), job(2, gpus=1)])
    decisions = fifo_exclusive(snapshot, now=0)
    assert placed_nodes(decisions) == {2: "a"}
    assert reasons(decisions) == {1: ReasonCode.WAITING_FOR_FREE_GPUS}


def test_memory_request_skips_gpus_that_are_too_small():
    snapshot = cluster(node("v100", gpus=8, mem_gib=32), node("a100", gpus=8, mem_gib=80, busy=4),
                       pending=[job(1, mem_gib=40)])
    assert placed_nodes(fifo_exclusive(snapshot, now=0)) == {1: "a100"}


@pytest.mark.parametrize(
    "nodes, request_, code, words",
    [
        ([], job(1), ReasonCode.NO_NODES_ONLINE, "No GPU node is online"),
        ([node("a", online=False)], job(1), ReasonCode.NO_NODES_ONLINE, "No GPU node is online"),
        ([node("a", cordoned=True)], job(1), ReasonCode.NO_NODES_ONLINE, "No GPU node is online"),
        ([node("a", gpus=8)], job(1, gpus=16, max_nodes=1), ReasonCode.GANG_LARGER_THAN_ANY_NODE,
         "Needs 16 GPUs on one node"),
        ([node("a", gpus=8), node("b", gpus=4)], job(1, gpus=16), ReasonCode.GANG_LARGER_THAN_CLUSTER,
         "Needs 16 GPUs; the online nodes have 12"),
        ([node("a", mem_gib=32)], job(1, mem_gib=40), ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY, "40 GiB"),
        ([node("a", gpus=8, busy=8)], job(1, gpus=2), ReasonCode.WAITING_FOR_FREE_GPUS,
         "Waiting for 2 GPUs; the most free on any node is 0"),
    ],
)
def test_pending_job_says_why(nodes, request_, code, words):
    (pending,) = fifo_exclusive(cluster(*nodes, pending=[request_]), now=0).pending
    assert pending.reason.code == code
    assert words in pending.reason.message


def test_decisions_are_deterministic_for_a_snapshot():
    snapshot = cluster(node("a", gpus=8, busy=3), node("b", gpus=8, busy=5),
                       pending=[job(i, gpus=1 + i % 3) for i in range(1, 10)])
    assert fifo_exclusive(snapshot, now=0) == fifo_exclusive(snapshot, now=0)


def test_gang_wider_than_a_node_takes_whole_free_nodes_most_free_first():
    snapshot = cluster(node("a", gpus=8, busy=2), node("b", gpus=8), node("c", gpus=8, busy=7),
                       pending=[job(1, gpus=12)])
    (place,) = fifo_exclusive(snapshot, now=0).placements
    assert [(s.node, len(s.gpu_ids), s.first_rank) for s in place.slices] == [("b", 8, 0), ("a", 4, 8)]
