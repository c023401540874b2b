"""The policies the trace replay compares share one signature and one snapshot."""

from dataclasses import replace

import pytest

from jobs.scheduling import decide
from jobs.scheduling.policies import (POLICIES, fifo_exclusive, least_attained_guaranteed, least_attained_service,
                                      packing_without_quotas)
from tests.scheduling.builders import classes, cluster, job, node, placed, preempted, running, tenant


def small_cluster():
    return cluster(node("a", gpus=2, util=0.2), node("b", gpus=4, busy=1),
                   tenants=[tenant("nlp", guaranteed=1, max_gpus=2)],
                   running=[running(9, on="a", gpus=[0], tenant="nlp", mem_gib=10)],
                   pending=[job(i, tenant="nlp" if i % 2 else "cv", gpus=1 + i % 3, mem_gib=8) for i in range(1, 9)])


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_decides_each_pending_job_once_and_deterministically(name):
    policy = POLICIES[name]
    snapshot = small_cluster()
    decisions = policy(snapshot, 0.0)
    decided = sorted([p.job_id for p in decisions.placements] + [p.job_id for p in decisions.pending])
    assert decided == list(range(1, 9))
    assert policy(snapshot, 0.0) == decisions


def test_fair_share_is_the_production_decide():
    assert POLICIES["fair_share"] is decide


def test_packing_without_quotas_never_reclaims():
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("owner", guaranteed=2), tenant("borrower")],
                       running=[running(9, on="a", gpus=[0, 1], tenant="borrower", opportunistic=True)],
                       pending=[job(1, tenant="owner")])
    assert preempted(decide(snapshot, now=0)) == [9]
    assert preempted(packing_without_quotas(snapshot, now=0)) == []


def test_packing_without_quotas_ignores_ceilings():
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("capped", max_gpus=0)], pending=[job(1, tenant="capped")])
    assert placed(decide(snapshot, now=0)) == {}
    assert classes(packing_without_quotas(snapshot, now=0)) == {1: "opportunistic"}


def test_packing_without_quotas_shares_gpus_that_fifo_keeps_exclusive():
    snapshot = cluster(node("a", gpus=1, util=0.1), running=[running(9, on="a", tenant="x", mem_gib=4)],
                       pending=[job(1, tenant="y", mem_gib=4, profile=(4, 0.2))])
    assert placed(packing_without_quotas(snapshot, now=0)) == {1: "a"}
    assert placed(fifo_exclusive(snapshot, now=0)) == {}


def las_job(id, attained=0.0, gpus=1, submitted_at=None, tenant="vision"):
    return replace(job(id, gpus=gpus, submitted_at=submitted_at or float(id), tenant=tenant), attained_gpu_s=attained)


def test_least_attained_service_runs_the_least_served_job_first():
    snapshot = cluster(node("a", gpus=1), pending=[las_job(1, attained=7200.0), las_job(2, attained=0.0)])
    assert placed(least_attained_service(snapshot, now=0)) == {2: "a"}


def test_least_attained_service_preempts_only_jobs_of_a_lower_queue():
    served = running(9, on="a", gpus=[0], tenant="cv", attained=7200.0)
    fresh = running(8, on="b", gpus=[0], tenant="cv", attained=60.0)
    snapshot = cluster(node("a", gpus=1), node("b", gpus=1), running=[served, fresh], pending=[las_job(1)])
    decisions = least_attained_service(snapshot, now=0)
    assert preempted(decisions) == [9]
    assert decisions.pending[0].reason.code == "reclaiming"
    # A job that has had more than the threshold itself waits instead of preempting.
    snapshot = cluster(node("a", gpus=1), running=[served], pending=[las_job(2, attained=4000.0)])
    assert preempted(least_attained_service(snapshot, now=0)) == []


def test_las_keeping_guarantees_never_takes_another_tenant_below_its_guarantee():
    # cv holds 2 GPUs on a guarantee of 1: one of them may go, the most served; never both.
    more, less = (running(9, on="a", gpus=[0], tenant="cv", attained=9000.0),
                  running(8, on="b", gpus=[0], tenant="cv", attained=7200.0))
    nodes = (node("a", gpus=1), node("b", gpus=1))
    tenants = [tenant("cv", guaranteed=1), tenant("nlp", guaranteed=1)]
    snapshot = cluster(*nodes, tenants=tenants, running=[more, less],
                       pending=[las_job(1, tenant="nlp"), las_job(2, tenant="nlp")])
    assert sorted(preempted(least_attained_service(snapshot, now=0))) == [8, 9]
    decisions = least_attained_guaranteed(snapshot, now=0)
    assert preempted(decisions) == [9]
    assert {p.job_id: p.reason.code for p in decisions.pending} == {1: "reclaiming", 2: "waiting_for_free_gpus"}


def test_las_keeping_guarantees_puts_a_tenants_own_fresh_job_before_its_served_one():
    # Within a tenant LAS order rules, guarantee or not: cv's fresh job takes its served job's GPU.
    served = running(9, on="a", gpus=[0], tenant="cv", attained=7200.0)
    snapshot = cluster(node("a", gpus=1), tenants=[tenant("cv", guaranteed=1)], running=[served],
                       pending=[las_job(1, tenant="cv")])
    assert preempted(least_attained_guaranteed(snapshot, now=0)) == [9]
