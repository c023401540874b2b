"""Packing: who may share a GPU (memory + headroom, compute room, guaranteed exclusivity),
fractions, recorded profiles, model constraints, and best fit."""

import pytest

from jobs.scheduling import SchedulerConfig, decide
from tests.scheduling.builders import cluster, codes, gpu_index, job, node, placed, running, tenant

BORROWERS = [tenant("owner", guaranteed=8), tenant("borrower")]


def landed(snapshot, decisions) -> dict[int, tuple[str, int]]:
    where = gpu_index(snapshot)
    return {p.job_id: where[p.gpu_ids[0]] for p in decisions.placements}


@pytest.mark.parametrize("resident_gib, util, new_gib, profile, shares", [
    (20, 0.3, 20, None, True),
    (20, 0.3, 58, None, True),     # 20 + 58 + 1 GiB headroom <= 80
    (20, 0.3, 60, None, False),    # 20 + 60 + 1 > 80
    (20, 0.8, 20, None, False),    # 20% spare is below the 25% a borrower needs to make progress
    (20, 0.7, 20, None, True),     # 30% spare: it runs on what is spare
    (20, 0.8, 20, (10, 0.15), True),  # profile says 15%: fits beside 80%
    (20, None, 20, None, False),   # no reading: the resident counts at its full request
    (None, 0.1, 5, None, False),   # resident without a memory figure owns the whole GPU
])
def test_borrower_over_commits_a_busy_gpu_only_when_memory_and_compute_fit(resident_gib, util, new_gib, profile,
                                                                           shares):
    snapshot = cluster(node("a", gpus=1, util={0: util}), tenants=BORROWERS,
                       running=[running(9, on="a", gpus=[0], tenant="owner", mem_gib=resident_gib)],
                       pending=[job(1, tenant="borrower", mem_gib=new_gib, profile=profile)])
    decisions = decide(snapshot, now=0)
    assert landed(snapshot, decisions).get(1) == (("a", 0) if shares else None)


def test_borrower_takes_an_empty_gpu_before_over_committing_a_busy_one():
    # The busy GPU's residents asked for all of it: joining it would slow both jobs, the empty
    # GPU costs nobody anything (and is reclaimed if its owner's tenant needs it).
    snapshot = cluster(node("a", gpus=2, util={0: 0.3}), tenants=BORROWERS,
                       running=[running(9, on="a", gpus=[0], tenant="owner", mem_gib=20)],
                       pending=[job(1, tenant="borrower", mem_gib=20)])
    assert landed(snapshot, decide(snapshot, now=0))[1] == ("a", 1)


def test_fraction_joins_fractions_whose_requests_leave_it_room_before_an_empty_gpu():
    snapshot = cluster(node("a", gpus=3, util={0: 0.2, 1: 0.2}), tenants=BORROWERS,
                       running=[running(9, on="a", gpus=[0], tenant="owner", milli=700, mem_gib=20),
                                running(8, on="a", gpus=[1], tenant="owner", milli=400, mem_gib=20)],
                       pending=[job(1, tenant="borrower", milli=500, mem_gib=20)])
    # GPU 0's requests leave 300 milli (too little), GPU 1's leave 600: it packs there.
    assert landed(snapshot, decide(snapshot, now=0))[1] == ("a", 1)


def test_shared_placement_carries_memory_limit_and_starts_throttled_next_to_guaranteed_work():
    snapshot = cluster(node("a", gpus=1, util=0.3), tenants=BORROWERS,
                       running=[running(9, on="a", tenant="owner", mem_gib=20)],
                       pending=[job(1, tenant="borrower", mem_gib=10, profile=(8, 0.2))])
    (place,) = decide(snapshot, now=0).placements
    assert str(place.job_class) == "opportunistic"
    assert place.memory_limit_mib == (8 + 1) * 1024  # profile peak + headroom
    assert place.duty_cycle == SchedulerConfig().shared_start_duty_cycle


def test_job_alone_on_its_gpu_has_no_memory_limit():
    snapshot = cluster(node("a", gpus=1), tenants=BORROWERS, pending=[job(1, tenant="owner", mem_gib=10)])
    (place,) = decide(snapshot, now=0).placements
    assert (place.memory_limit_mib, place.duty_cycle) == (None, 1.0)


@pytest.mark.parametrize("resident, newcomer, shares", [
    (dict(mem_gib=10), dict(mem_gib=10), False),                            # both exclusive
    (dict(mem_gib=10, shareable=True), dict(mem_gib=10), False),            # newcomer did not agree
    (dict(mem_gib=10), dict(mem_gib=10, shareable=True), False),            # resident did not agree
    (dict(mem_gib=10, milli=500), dict(mem_gib=10, milli=500), True),       # fractions share
    (dict(mem_gib=10, milli=600), dict(mem_gib=10, milli=500), False),      # 1.1 GPUs of guarantees
    (dict(mem_gib=10, shareable=True, milli=400), dict(mem_gib=10, shareable=True, milli=600), True),
])
def test_guaranteed_jobs_share_a_gpu_only_when_both_allow_it(resident, newcomer, shares):
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("owner", guaranteed=4)],
                       running=[running(9, on="a", gpus=[0], tenant="owner", **resident)],
                       pending=[job(1, tenant="owner", **newcomer)])
    decisions = decide(snapshot, now=0)
    assert str(decisions.placements[0].job_class) == "guaranteed"
    assert landed(snapshot, decisions)[1] == ("a", 0 if shares else 1)


def test_fractional_jobs_pack_onto_one_gpu():
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("owner", guaranteed=2)],
                       pending=[job(i, tenant="owner", milli=250, mem_gib=8) for i in range(1, 5)])
    decisions = decide(snapshot, now=0)
    assert set(landed(snapshot, decisions).values()) == {("a", 0)}


def test_guaranteed_job_may_sit_beside_borrowers_when_no_gpu_is_empty():
    snapshot = cluster(node("a", gpus=1, util=0.2), tenants=BORROWERS,
                       running=[running(9, on="a", tenant="borrower", opportunistic=True, mem_gib=10)],
                       pending=[job(1, tenant="owner", mem_gib=40)])
    decisions = decide(snapshot, now=0)
    assert placed(decisions) == {1: "a"} and not decisions.preemptions
    (throttle,) = decisions.throttles
    assert (throttle.job_id, str(throttle.reason)) == (9, "guaranteed_job_placed")


def test_guaranteed_job_prefers_an_empty_gpu_to_a_shared_one():
    snapshot = cluster(node("a", gpus=2, util=0.2), tenants=BORROWERS,
                       running=[running(9, on="a", gpus=[0], tenant="borrower", opportunistic=True, mem_gib=10)],
                       pending=[job(1, tenant="owner", mem_gib=10)])
    decisions = decide(snapshot, now=0)
    assert landed(snapshot, decisions)[1] == ("a", 1)


def test_recorded_profile_is_used_instead_of_the_inflated_request():
    snapshot = cluster(node("a", gpus=1, mem_gib=80, util=0.2), tenants=BORROWERS,
                       running=[running(9, on="a", tenant="owner", mem_gib=50)],
                       pending=[job(1, tenant="borrower", mem_gib=40), job(2, tenant="borrower", mem_gib=40,
                                                                           profile=(12, 0.3))])
    assert placed(decide(snapshot, now=0)) == {2: "a"}


@pytest.mark.parametrize("models, expected", [
    (("V100M16", "V100M32"), "v100"),
    (("A100-80GB",), "a100"),
    ((), "v100"),  # best fit: the smallest GPU memory that holds 10 GiB
])
def test_gpu_model_constraint_is_honoured(models, expected):
    snapshot = cluster(node("a100", gpus=1, mem_gib=80, model="A100-80GB"),
                       node("v100", gpus=1, mem_gib=16, model="V100M16"), tenants=BORROWERS,
                       pending=[job(1, tenant="owner", mem_gib=10, models=models)])
    assert placed(decide(snapshot, now=0)) == {1: expected}


def test_best_fit_over_commits_the_gpu_left_tightest():
    # (no GPU is empty: with one, the borrower would take it before over-committing either)
    snapshot = cluster(node("a", gpus=2, util=0.1), tenants=BORROWERS,
                       running=[running(8, on="a", gpus=[0], tenant="owner", mem_gib=20),
                                running(9, on="a", gpus=[1], tenant="owner", mem_gib=60)],
                       pending=[job(1, tenant="borrower", mem_gib=10, profile=(10, 0.2))])
    assert landed(snapshot, decide(snapshot, now=0))[1] == ("a", 1)


def test_whole_gpu_job_goes_to_the_fullest_node():
    snapshot = cluster(node("empty", gpus=8), node("half", gpus=8, busy=6), tenants=BORROWERS,
                       pending=[job(1, tenant="owner", gpus=2)])
    assert placed(decide(snapshot, now=0)) == {1: "half"}


def test_gang_takes_only_empty_gpus():
    """A straggler GPU paces the whole ring, so a gang never shares."""
    snapshot = cluster(node("a", gpus=2, util=0.0), tenants=BORROWERS,
                       running=[running(9, on="a", gpus=[0], tenant="borrower", opportunistic=True, mem_gib=1,
                                        util=0.0)],
                       pending=[job(1, tenant="borrower", gpus=2, mem_gib=1, profile=(1, 0.1))])
    decisions = decide(snapshot, now=0)
    assert placed(decisions) == {}
    assert codes(decisions) == {1: "holding_reservation"}


def test_busy_gpu_of_unknown_holder_takes_nothing():
    snapshot = cluster(node("a", gpus=1, busy=1), tenants=BORROWERS,
                       pending=[job(1, tenant="borrower", milli=100, mem_gib=1)])
    assert placed(decide(snapshot, now=0)) == {}


def test_cordoned_node_gets_nothing_new():
    snapshot = cluster(node("a", gpus=1, cordoned=True), node("b", gpus=1), tenants=BORROWERS,
                       pending=[job(1, tenant="owner"), job(2, tenant="owner")])
    assert placed(decide(snapshot, now=0)) == {1: "b"}


def test_fractions_fill_the_room_requests_leave_before_any_gpu_is_over_committed():
    """A cluster 20% free in fractions left by its residents' requests, and a queue of fractions
    that fit that room exactly: every one is placed, and no GPU is promised past one whole GPU
    (the issue's "fair_share stops placing on fractional workloads": borrowers piled onto GPUs
    whose live load looked light, so the room the requests left was never used)."""
    residents = [running(100 + 10 * n + g, on=f"n{n}", gpus=[g], tenant="owner", milli=800, mem_gib=8, util=0.2)
                 for n in range(2) for g in range(4)]
    queue = [job(i, tenant="borrower", milli=200, mem_gib=2) for i in range(1, 9)]
    snapshot = cluster(node("n0", gpus=4, util=0.2), node("n1", gpus=4, util=0.2), tenants=BORROWERS,
                       running=residents, pending=queue)
    decisions = decide(snapshot, now=0)
    assert {p.job_id for p in decisions.placements} == {j.id for j in queue}
    promised = {}
    for job_ in [*snapshot.running, *decisions.placements]:
        for gpu_id in job_.gpu_ids:
            promised[gpu_id] = promised.get(gpu_id, 0) + job_.gpu_milli
    assert max(promised.values()) <= 1000, promised


def test_a_gang_keeps_the_node_it_fits_best_and_leaves_the_large_node_whole():
    """Two empty nodes of different models, both able to hold a 4-GPU gang: the gang takes the one
    it fills (FGD's gradient is the same; of the two the tighter fit leaves the bigger node for
    what only it can hold)."""
    snapshot = cluster(node("large", gpus=8, model="A100-80GB", cpus=128),
                       node("small", gpus=4, model="H100-80GB", cpus=48), tenants=BORROWERS,
                       pending=[job(1, tenant="owner", gpus=4, mem_gib=10, cpus=40)])
    assert placed(decide(snapshot, now=0)) == {1: "small"}


def test_a_cpu_hungry_job_leaves_a_cpu_tight_node_the_cpu_its_free_gpus_need():
    """Issue 34: two empty 8-GPU nodes, one with few cores. The jobs here ask 12 cores a GPU; a new
    one asks 20. On the tight node it would leave 20 cores for 7 GPUs (their due: 84), on the roomy
    one it takes nothing its GPUs need. BestFit's tie-break alone takes the tight node (the job
    fits either with room for the class, so FGD's gradient is 0 on both)."""
    snapshot = cluster(node("tight", gpus=8, cpus=40), node("roomy", gpus=8, cpus=200),
                       node("full", gpus=2, cpus=24), tenants=BORROWERS,
                       running=[running(8, on="full", gpus=[0], tenant="owner", cpus=12),
                                running(9, on="full", gpus=[1], tenant="owner", cpus=12)],
                       pending=[job(1, tenant="owner", mem_gib=10, cpus=20)])
    assert placed(decide(snapshot, now=0)) == {1: "roomy"}


@pytest.mark.parametrize("profile", [None, (5, 0.9)], ids=["request", "profile above its share"])
def test_borrowers_packed_beside_a_guaranteed_job_are_all_that_fit_the_next_cycle_too(profile):
    # Each borrower starts throttled to the start duty cycle beside the guaranteed job, and the
    # next cycle reads its load back at that duty cycle (its profile's use, else its request):
    # the cycle that places them must count them so, or the room they leave opens one borrower
    # at a time, cycle after cycle (the queue's verdicts and ETAs moving with every step), or the
    # GPU ends up loaded past what a borrower may join.
    config = SchedulerConfig()
    guaranteed = running(9, on="a", tenant="owner", milli=500, mem_gib=10, shareable=True)
    snapshot = cluster(node("a", gpus=1), tenants=BORROWERS, running=[guaranteed],
                       pending=[job(i, tenant="borrower", milli=250, mem_gib=5, profile=profile) for i in range(1, 9)])
    first = decide(snapshot, now=0, config=config)
    assert {p.duty_cycle for p in first.placements} == {config.shared_start_duty_cycle}
    # What fits, by the next cycle's reading: a borrower joins while the load leaves it its room.
    each = round((profile[1] if profile else 0.25) * config.shared_start_duty_cycle * 1000)
    load, fits = 500, 0
    while fits < 8 and config.max_shared_load_milli - load >= min(250, config.min_shared_room_milli):
        load, fits = load + each, fits + 1
    assert len(first.placements) == fits > 1
    now_running = [running(p.job_id, on="a", tenant="borrower", opportunistic=True, milli=250, mem_gib=5,
                           duty=p.duty_cycle, solo=profile[1] if profile else None) for p in first.placements]
    started = {p.job_id for p in first.placements}
    again = cluster(node("a", gpus=1), tenants=BORROWERS, running=[guaranteed, *now_running],
                    pending=[j for j in snapshot.pending if j.id not in started])
    assert decide(again, now=2, config=config).placements == ()
