"""The replay driver on hand-made traces whose outcome can be worked out on paper."""

import pytest

from jobs.scheduling.policies import POLICIES
from jobs.scheduling.simulate import replay
from tests.simulate.builders import tjob, trace


def finish_times(result):
    return {job_id: record.finish for job_id, record in result.records.items()}


def test_a_lone_job_starts_at_the_next_cycle_and_runs_its_solo_runtime():
    result = replay(trace([tjob(1, submit=1.0, duration=100)]), POLICIES["fair_share"])
    record = result.records[1]
    assert record.first_start == 2.0  # the 2 s production grid
    assert record.finish == pytest.approx(102.0)
    assert record.queued_s == pytest.approx(1.0)


def test_exclusive_fifo_runs_two_jobs_one_after_the_other():
    jobs = [tjob(1, util=0.6, opportunistic_only=True), tjob(2, util=0.6, opportunistic_only=True)]
    result = replay(trace(jobs), POLICIES["fifo_exclusive"])
    assert finish_times(result) == {1: pytest.approx(100.0), 2: pytest.approx(200.0)}


def test_packed_jobs_share_a_gpu_and_slow_by_their_summed_load():
    # Job 2 joins at the second cycle (t=2), once job 1's live utilisation (0.6) shows room. Together
    # they load the GPU to 1.2, so each runs at 1/1.2 of its solo speed.
    jobs = [tjob(1, util=0.6, opportunistic_only=True), tjob(2, util=0.6, opportunistic_only=True)]
    result = replay(trace(jobs), POLICIES["packing_without_quotas"])
    first = 2 + 98 * 1.2
    assert result.records[2].first_start == 2.0
    assert finish_times(result) == {1: pytest.approx(first), 2: pytest.approx(first + 2)}
    assert result.memory_violations == 0


def test_borrower_next_to_a_returning_owner_is_throttled_so_the_owner_runs_near_solo_speed():
    # Both fit in the GPU's memory: the owner joins the borrower, whose duty cycle is cut (AIMD).
    quotas = [("owner", 1, 1), ("borrower", 0, 1)]
    jobs = [tjob(1, tenant="borrower", duration=1000), tjob(2, tenant="owner", submit=100, duration=50)]
    result = replay(trace(jobs, quotas=quotas), POLICIES["fair_share"])
    borrower, owner = result.records[1], result.records[2]
    assert borrower.preemptions == 0 and borrower.throttles >= 3
    assert owner.finish - owner.first_start < 50 * 1.2
    assert borrower.finish > 1000 + 50 * 0.8  # it gave the owner most of the GPU


def test_a_borrower_that_saturates_the_gpu_even_at_the_floor_is_suspended_then_resumed():
    # Both would use the whole GPU: cutting the borrower to the floor is not enough, so it stops
    # (keeping its memory) while the owner runs, and carries on once the owner is done.
    quotas = [("owner", 1, 1), ("borrower", 0, 1)]
    jobs = [tjob(1, tenant="borrower", duration=1000, util=1.0), tjob(2, tenant="owner", submit=100, duration=200,
                                                                       util=1.0)]
    result = replay(trace(jobs, quotas=quotas), POLICIES["fair_share"])
    borrower, owner = result.records[1], result.records[2]
    assert result.suspensions >= 1 and borrower.preemptions == 0
    assert owner.finish - owner.first_start < 200 * 1.1  # near solo speed once the borrower stopped
    assert borrower.finish > owner.finish  # it waited, then finished its work
    assert result.unfinished == []


def test_reclaimed_borrower_resumes_its_work_after_the_owner_with_a_restart_overhead():
    # 50 GiB each on an 80 GiB GPU: no sharing, so the owner's guarantee preempts the borrower.
    quotas = [("owner", 1, 1), ("borrower", 0, 1)]
    jobs = [tjob(1, tenant="borrower", duration=1000, mem_gib=50),
            tjob(2, tenant="owner", submit=100, duration=50, mem_gib=50)]
    result = replay(trace(jobs, quotas=quotas), POLICIES["fair_share"], restart_overhead_s=30)
    borrower, owner = result.records[1], result.records[2]
    assert borrower.preemptions == 1 and result.preemptions == 1
    assert owner.finish == pytest.approx(owner.first_start + 50)
    assert owner.first_start <= 104  # the reclaim cycle at 100, the owner starts a cycle later
    # 100 s done before the preemption; 900 + 30 left once the owner is gone.
    assert borrower.finish == pytest.approx(owner.finish + 930, abs=2.0)


def test_a_job_no_policy_can_place_is_reported_unfinished_instead_of_looping():
    jobs = [tjob(1, gpus=1, mem_gib=200)]  # bigger than any GPU
    result = replay(trace(jobs), POLICIES["fair_share"])
    assert result.unfinished == [1]


def test_utilisation_integrals_match_a_single_job_on_half_the_gpus():
    jobs = [tjob(1, gpus=1, duration=100, util=0.5)]
    result = replay(trace(jobs, nodes=(("a", 2),)), POLICIES["fifo_exclusive"])
    assert result.busy_gpu_s == pytest.approx(100.0)
    assert result.used_gpu_s == pytest.approx(50.0)


def test_a_preempted_job_finishes_its_remaining_work_after_its_restart_not_when_its_first_run_would_have():
    # LAS preempts job 1 (past one GPU-hour at t=4000) for job 2; job 1's first run would have ended
    # at 7200, and it must not: 4000 s done, 3200 + 30 left once job 2 is done at ~5002. (Job 3, on
    # the other GPU, ends in between: the first run's completion is still queued when job 1 restarts.)
    jobs = [tjob(1, duration=7200), tjob(3, submit=1000, duration=5500), tjob(2, submit=4000, duration=1000)]
    result = replay(trace(jobs, nodes=(("a", 2),)), POLICIES["least_attained_service"], restart_overhead_s=30)
    first, second = result.records[1], result.records[2]
    assert first.preemptions == 1 and result.records[3].preemptions == 0
    assert second.finish == pytest.approx(5002, abs=2)
    assert first.finish == pytest.approx(second.finish + 3230, abs=2)
