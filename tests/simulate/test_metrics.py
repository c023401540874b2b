"""The figures a replay reports, on cases worked out by hand."""

import pytest

from jobs.scheduling.policies import POLICIES
from jobs.scheduling.simulate import replay
from jobs.scheduling.simulate.metrics import fill_curve, fill_summary, jain_index, percentile, summarise
from tests.simulate.builders import tjob, trace


@pytest.mark.parametrize("values, expected", [([1, 1, 1, 1], 1.0), ([1, 0, 0, 0], 0.25), ([2, 1], 0.9)])
def test_jain_index(values, expected):
    assert jain_index(values) == pytest.approx(expected)


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 95) == 95 and percentile(values, 50) == 50 and percentile([7], 95) == 7


def test_summary_of_two_tenants_one_waiting_behind_the_other():
    jobs = [tjob(1, tenant="a", duration=100), tjob(2, tenant="b", duration=100)]
    summary = summarise(replay(trace(jobs), POLICIES["fifo_exclusive"]))
    assert summary["jct_s"]["mean"] == pytest.approx(150.0)
    assert summary["queueing_s"]["mean"] == pytest.approx(50.0)
    assert summary["makespan_s"] == pytest.approx(200.0)
    assert summary["gpu_allocation"] == pytest.approx(1.0)
    assert summary["tenants"]["a"]["gpu_hours"] == pytest.approx(100 / 3600)
    assert summary["tenants"]["a"]["mean_slowdown"] == pytest.approx(1.0)
    assert summary["tenants"]["b"]["mean_slowdown"] == pytest.approx(2.0)
    assert summary["jain_fairness"] == pytest.approx(jain_index([1.0, 0.5]))


def test_fill_curve_shows_packing_places_fractions_that_exclusive_gpus_strand():
    # Eight quarter-GPU jobs on two GPUs: packing fits them all, exclusive FIFO only two.
    jobs = [tjob(i, milli=250, util=0.25, mem_gib=10) for i in range(1, 9)]
    cluster = trace(jobs, nodes=(("a", 2),))
    packed = fill_summary(fill_curve(cluster, POLICIES["packing_without_quotas"], step=0.5, until=1.0))
    exclusive = fill_summary(fill_curve(cluster, POLICIES["fifo_exclusive"], step=0.5, until=1.0))
    assert packed["allocated_at_100"] == pytest.approx(1.0)
    assert exclusive["allocated_at_100"] == pytest.approx(0.25)


def test_guaranteed_slowdown_is_what_a_borrower_beside_it_cost_it():
    # One GPU: owner's guaranteed job, then a borrower packed beside it (both light enough to
    # share). Interference slows the owner while they overlap; alone, it is not slowed at all.
    owner = tjob(1, tenant="owner", duration=1000, util=0.3, mem_gib=10)
    borrower = tjob(2, tenant="guest", submit=10, duration=400, util=0.3, mem_gib=10, opportunistic_only=True)
    quotas = (("owner", 1, 1), ("guest", 0, 1))
    shared = summarise(replay(trace([owner, borrower], quotas=quotas), POLICIES["fair_share"], interference=0.3))
    alone = summarise(replay(trace([owner], quotas=quotas), POLICIES["fair_share"], interference=0.3))
    assert alone["guaranteed_slowdown"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 < shared["guaranteed_slowdown"] < 0.3
    assert summarise(replay(trace([borrower], quotas=quotas), POLICIES["fair_share"]))["guaranteed_slowdown"] is None
