"""Quotas and classes: guaranteed inside the guarantee, borrowing beyond it by weighted fair share,
never past the ceiling; within a tenant, priority then submit time."""

import math

import pytest

from jobs.scheduling import SchedulerConfig, decay_usage, decide
from jobs.scheduling.usage import steady_state_usage, weighted_share
from tests.scheduling.builders import classes, cluster, codes, job, node, placed, running, tenant


def test_job_within_guarantee_runs_guaranteed():
    snapshot = cluster(node("a", gpus=4), tenants=[tenant("nlp", guaranteed=2, max_gpus=4)],
                       pending=[job(1, tenant="nlp", gpus=2)])
    assert classes(decide(snapshot, now=0)) == {1: "guaranteed"}


def test_over_quota_job_runs_opportunistic():
    snapshot = cluster(node("a", gpus=4), tenants=[tenant("nlp", guaranteed=2, max_gpus=4)],
                       pending=[job(1, tenant="nlp", gpus=2), job(2, tenant="nlp", gpus=1)])
    assert classes(decide(snapshot, now=0)) == {1: "guaranteed", 2: "opportunistic"}


def test_job_too_big_for_what_is_left_of_the_guarantee_borrows_and_a_smaller_one_uses_it():
    snapshot = cluster(node("a", gpus=8), tenants=[tenant("nlp", guaranteed=2, max_gpus=8)],
                       running=[running(9, on="a", gpus=[0], tenant="nlp")],
                       pending=[job(1, tenant="nlp", gpus=2), job(2, tenant="nlp", gpus=1)])
    assert classes(decide(snapshot, now=0)) == {1: "opportunistic", 2: "guaranteed"}


def test_opportunistic_only_job_never_runs_guaranteed():
    snapshot = cluster(node("a", gpus=4), tenants=[tenant("nlp", guaranteed=4)],
                       pending=[job(1, tenant="nlp", opportunistic_only=True)])
    assert classes(decide(snapshot, now=0)) == {1: "opportunistic"}


@pytest.mark.parametrize("guaranteed, max_gpus, held, pending, placed_count", [
    (2, 4, 0, 6, 4),
    (2, 4, 3, 6, 1),
    (0, 0, 0, 3, 0),
    (4, 2, 0, 6, 4),  # a ceiling below the guarantee means no borrowing, not less than owed
    (0, 3, 3, 2, 0),
])
def test_tenant_never_exceeds_max_gpus(guaranteed, max_gpus, held, pending, placed_count):
    snapshot = cluster(node("a", gpus=16), tenants=[tenant("nlp", guaranteed=guaranteed, max_gpus=max_gpus)],
                       running=[running(100 + i, on="a", gpus=[i], tenant="nlp") for i in range(held)],
                       pending=[job(i, tenant="nlp") for i in range(1, pending + 1)])
    decisions = decide(snapshot, now=0)
    assert len(decisions.placements) == placed_count
    # (a ceiling of 0 refuses even one GPU: over_max_gpus, the job alone is over it)
    assert set(codes(decisions).values()) <= {"at_max_gpus", "over_max_gpus"}


def test_at_ceiling_says_the_ceiling_and_when():
    snapshot = cluster(node("a", gpus=8), tenants=[tenant("nlp", guaranteed=1, max_gpus=2)],
                       running=[running(9, on="a", gpus=[0, 1], tenant="nlp", runtime=100, started_at=0)],
                       pending=[job(1, tenant="nlp")])
    (pending,) = decide(snapshot, now=40).pending
    assert pending.reason.code == "at_max_gpus"
    assert "at its 2-GPU ceiling" in pending.reason.message
    assert pending.eta_at == 100


def test_a_job_at_its_ceiling_is_told_the_same_words_whatever_its_tenant_runs_under_it():
    """What a tenant runs moves with each of its jobs that starts or ends; a job waiting at the
    ceiling is told the same, so its verdict (one of thousands) is not rewritten each time."""
    def told(running_gpus: int):
        snapshot = cluster(node("a", gpus=8), tenants=[tenant("nlp", guaranteed=1, max_gpus=4)],
                           running=[running(9 + i, on="a", gpus=[i], tenant="nlp", runtime=100, started_at=0)
                                    for i in range(running_gpus)],
                           pending=[job(1, tenant="nlp", gpus=2)])
        (pending,) = decide(snapshot, now=40).pending
        assert pending.reason.code == "at_max_gpus"
        return pending.reason

    assert told(3) == told(4)


@pytest.mark.parametrize("a, b, first", [
    (dict(usage=0.0), dict(usage=1e6), "a"),
    (dict(usage=1e6), dict(usage=0.0), "b"),
    (dict(usage=2e6, weight=4.0), dict(usage=1e6), "a"),  # weight divides usage
    (dict(usage=0.0), dict(usage=0.0), "a"),  # a tie goes by tenant name
])
def test_borrowing_goes_to_lowest_weighted_usage_first(a, b, first):
    snapshot = cluster(node("n", gpus=1), tenants=[tenant("a", **a), tenant("b", **b)],
                       pending=[job(1, tenant="a"), job(2, tenant="b")])
    decisions = decide(snapshot, now=0)
    assert placed(decisions) == {1 if first == "a" else 2: "n"}
    assert list(codes(decisions).values()) == ["behind_lower_usage_tenants"]


def test_borrowing_is_shared_out_as_tenants_place():
    """Each placement raises its tenant's share, so equal tenants alternate."""
    snapshot = cluster(node("n", gpus=4), tenants=[tenant("a"), tenant("b")],
                       pending=[job(i, tenant="a") for i in range(1, 5)] + [job(i, tenant="b") for i in range(5, 9)])
    assert sorted(placed(decide(snapshot, now=0))) == [1, 2, 5, 6]


def test_gpus_held_now_count_toward_share():
    snapshot = cluster(node("n", gpus=4), tenants=[tenant("a"), tenant("b")],
                       running=[running(9, on="n", gpus=[0, 1], tenant="a", opportunistic=True)],
                       pending=[job(1, tenant="a"), job(2, tenant="b")])
    assert sorted(placed(decide(snapshot, now=0))) == [1, 2]
    one_gpu = cluster(node("n", gpus=3), tenants=[tenant("a"), tenant("b")],
                      running=[running(9, on="n", gpus=[0, 1], tenant="a", opportunistic=True)],
                      pending=[job(1, tenant="a"), job(2, tenant="b")])
    assert placed(decide(one_gpu, now=0)) == {2: "n"}


@pytest.mark.parametrize("jobs, expected", [
    ([job(1, submitted_at=20), job(2, submitted_at=10)], 2),
    ([job(1, submitted_at=10), job(2, submitted_at=20, priority=5)], 2),
    ([job(2, submitted_at=10), job(1, submitted_at=10)], 1),  # same time: lower id first
])
def test_within_tenant_priority_then_submit_time(jobs, expected):
    snapshot = cluster(node("n", gpus=1), tenants=[tenant("vision", guaranteed=1)], pending=jobs)
    assert placed(decide(snapshot, now=0)) == {expected: "n"}


def test_guaranteed_work_goes_before_any_borrowing():
    snapshot = cluster(node("n", gpus=1), tenants=[tenant("rich", usage=0.0), tenant("owed", guaranteed=1, usage=9e9)],
                       pending=[job(1, tenant="rich", priority=9), job(2, tenant="owed")])
    assert placed(decide(snapshot, now=0)) == {2: "n"}


def test_unknown_tenant_borrows_without_ceiling():
    snapshot = cluster(node("n", gpus=4), pending=[job(i, tenant="ghost") for i in range(1, 4)])
    assert set(classes(decide(snapshot, now=0)).values()) == {"opportunistic"}


@pytest.mark.parametrize("previous, gpus, elapsed, half_life, expected", [
    (100.0, 0, 10.0, 10.0, 50.0),  # one half-life halves it
    (100.0, 0, 20.0, 10.0, 25.0),
    (0.0, 2, 0.0, 10.0, 0.0),
    (0.0, 1, 1e9, 10.0, 10.0 / math.log(2)),  # converges to gpus * half-life / ln 2
    (7.0, 3, 0.0, 10.0, 7.0),
])
def test_decay_usage(previous, gpus, elapsed, half_life, expected):
    assert decay_usage(previous, gpus, elapsed, half_life) == pytest.approx(expected)


def test_decay_usage_does_not_depend_on_how_often_it_is_called():
    once = decay_usage(500.0, 4, 3600.0, 1800.0)
    stepped = 500.0
    for _ in range(1800):
        stepped = decay_usage(stepped, 4, 2.0, 1800.0)
    assert stepped == pytest.approx(once)


def test_idle_tenant_is_not_punished_for_one_old_burst():
    burst = decay_usage(0.0, 64, 3600.0, 86400.0)  # an hour of 64 GPUs
    after_a_week_idle = decay_usage(burst, 0, 7 * 86400.0, 86400.0)
    steady = steady_state_usage(1, 86400.0)  # someone holding one GPU all along
    assert weighted_share(after_a_week_idle, 0, 1.0, 86400.0) < weighted_share(steady, 1000, 1.0, 86400.0)


def test_config_half_life_sets_how_much_a_held_gpu_weighs():
    short = SchedulerConfig(usage_half_life_s=60.0)
    snapshot = cluster(node("n", gpus=3), tenants=[tenant("a", usage=1000.0), tenant("b")],
                       running=[running(9, on="n", gpus=[0, 1], tenant="b", opportunistic=True)],
                       pending=[job(1, tenant="a"), job(2, tenant="b")])
    # b holds 2 GPUs ~ 173 GPU-s at a 60 s half-life: less than a's 1000 recent GPU-s.
    assert placed(decide(snapshot, now=0, config=short)) == {2: "n"}
    assert placed(decide(snapshot, now=0)) == {1: "n"}


def test_borrowers_sharing_over_committed_gpus_count_their_share_against_the_ceiling():
    """Two borrowers of nlp each share a GPU with a borrower of cv: nlp holds one GPU's worth of
    the cluster, not two, so with a 2-GPU ceiling its next job may still start (counted whole,
    it waited at its ceiling beside two idle GPUs)."""
    snapshot = cluster(node("a", gpus=4),
                       tenants=[tenant("nlp", guaranteed=0, max_gpus=2), tenant("cv", guaranteed=0, max_gpus=4)],
                       running=[running(10, on="a", gpus=[0], tenant="nlp", opportunistic=True, mem_gib=10),
                                running(11, on="a", gpus=[1], tenant="nlp", opportunistic=True, mem_gib=10),
                                running(20, on="a", gpus=[0], tenant="cv", opportunistic=True, mem_gib=10),
                                running(21, on="a", gpus=[1], tenant="cv", opportunistic=True, mem_gib=10)],
                       pending=[job(1, tenant="nlp", mem_gib=10)])
    decisions = decide(snapshot, now=0)
    assert placed(decisions) == {1: "a"}


def test_borrowers_alone_on_their_gpus_count_whole_against_the_ceiling():
    snapshot = cluster(node("a", gpus=4),
                       tenants=[tenant("nlp", guaranteed=0, max_gpus=2), tenant("cv", guaranteed=0, max_gpus=4)],
                       running=[running(10, on="a", gpus=[0], tenant="nlp", opportunistic=True, mem_gib=10),
                                running(11, on="a", gpus=[1], tenant="nlp", opportunistic=True, mem_gib=10)],
                       pending=[job(1, tenant="nlp", mem_gib=10)])
    assert codes(decide(snapshot, now=0)) == {1: "at_max_gpus"}
