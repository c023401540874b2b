"""The memory margin on a shared GPU: kept for residents whose use may grow, not for fractions
held to their share (two halves fill one GPU exactly), and judged the same way by placement and
by memory pressure, so nothing is placed only to be evicted on the next cycle."""

from jobs.scheduling import decide
from tests.scheduling.builders import cluster, job, node, placed, preempted, running, tenant

TENANTS = [tenant("vision", guaranteed=2), tenant("nlp")]


def test_two_half_gpu_jobs_share_one_gpu():
    snapshot = cluster(node("a", gpus=1, mem_gib=16), tenants=TENANTS,
                       pending=[job(1, milli=500), job(2, milli=500, tenant="nlp")])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {1: "a", 2: "a"}
    assert {p.job_id: p.memory_limit_mib for p in decisions.placements} == {1: 8192, 2: 8192}


def test_a_half_joins_a_resident_half_that_holds_its_share():
    snapshot = cluster(node("a", gpus=1, mem_gib=16), tenants=TENANTS,
                       running=[running(9, on="a", milli=500, mem_gib=8, util=0.4)],
                       pending=[job(1, milli=500, tenant="nlp")])
    assert placed(decide(snapshot, now=10)) == {1: "a"}


def test_a_whole_gpu_resident_keeps_its_margin_and_is_not_squeezed_afterwards():
    # 8.4 GiB used by a whole-GPU guaranteed job leaves 7.6 GiB: a 470-milli share (7.5 GiB)
    # would fit only without the margin the resident may grow into.
    snapshot = cluster(node("a", gpus=1, mem_gib=16), tenants=TENANTS,
                       running=[running(9, on="a", mem_gib=8.4, util=0.3)],
                       pending=[job(1, milli=470, tenant="nlp")])
    assert placed(decide(snapshot, now=10)) == {}
    with_borrower = cluster(node("a", gpus=1, mem_gib=16), tenants=TENANTS,
                            running=[running(9, on="a", mem_gib=6, util=0.3),
                                     running(5, on="a", milli=470, mem_gib=7.5, tenant="nlp", opportunistic=True)])
    assert preempted(decide(with_borrower, now=10)) == []  # 6 + 7.5 + 1 GiB margin fits 16


def test_fractions_that_add_up_to_one_gpu_share_it_whatever_its_memory_in_mib():
    """Each share's memory is its fraction of the GPU, rounded down: rounded up, 650 + 350 milli of
    a GPU of 32,510 MiB asked 21,132 + 11,379 = 32,511 MiB, one more than it has, and the second
    fraction found no room on a GPU its requests would exactly fill."""
    snapshot = cluster(node("a", gpus=1, mem_gib=32510 / 1024), tenants=TENANTS,
                       pending=[job(1, milli=650), job(2, milli=350, tenant="nlp")])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {1: "a", 2: "a"}
    limits = {p.job_id: p.memory_limit_mib for p in decisions.placements}
    assert limits == {1: 21131, 2: 11378} and sum(limits.values()) <= 32510
