"""Why pending: every pending job gets a typed reason in plain words, and an ETA where running
jobs' expected ends allow one."""

import pytest

from jobs.scheduling import ReasonCode, decide
from tests.scheduling.builders import cluster, codes, job, node, pending_of, placed, running, tenant

T = [tenant("nlp", guaranteed=2, max_gpus=4), tenant("cv", guaranteed=0, max_gpus=8), tenant("wide", guaranteed=0)]


@pytest.mark.parametrize("nodes, running_, request_, code, words", [
    ([], [], job(1, tenant="nlp"), ReasonCode.NO_NODES_ONLINE, "No GPU node is online"),
    ([node("a", online=False)], [], job(1, tenant="nlp"), ReasonCode.NO_NODES_ONLINE, "No GPU node is online"),
    ([node("a", cordoned=True)], [], job(1, tenant="nlp"), ReasonCode.NO_NODES_ONLINE, "all 1 are cordoned"),
    ([node("a", gpus=8, cordoned=True), node("b", gpus=4)], [], job(1, tenant="wide", gpus=8, max_nodes=1),
     ReasonCode.NEEDS_CORDONED_NODES, "Only cordoned nodes (a) can run this job"),
    ([node("a", model="V100M32", cordoned=True), node("b")], [], job(1, tenant="nlp", models=("V100M32",)),
     ReasonCode.NEEDS_CORDONED_NODES, "Elsewhere: Needs a V100M32 GPU"),
    ([node("a", gpus=8)], [], job(1, tenant="wide", gpus=16, max_nodes=1), ReasonCode.GANG_LARGER_THAN_ANY_NODE,
     "Needs 16 GPUs on one node; the largest online node has 8"),
    ([node("a", gpus=8)], [], job(1, tenant="wide", gpus=16), ReasonCode.GANG_LARGER_THAN_CLUSTER,
     "the online cluster has only 8"),
    ([node("a", mem_gib=32)], [], job(1, tenant="nlp", mem_gib=40), ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY,
     "Needs a GPU with 40 GiB of memory; the largest online GPU has 32 GiB"),
    ([node("a", model="A100-80GB")], [], job(1, tenant="nlp", models=("V100M16", "V100M32")),
     ReasonCode.GPU_MODEL_UNAVAILABLE, "Needs a V100M16 or V100M32 GPU"),
    ([node("a")], [], job(1, tenant="nlp", gpus=2, milli=500), ReasonCode.INVALID_REQUEST, "only be asked for one GPU"),
    ([node("a")], [], job(1, tenant="nlp", gpus=0), ReasonCode.INVALID_REQUEST, "asks for 0 GPUs"),
    ([node("a", gpus=4)], [running(9, gpus=[0, 1, 2, 3], tenant="nlp")], job(1, tenant="nlp"),
     ReasonCode.AT_MAX_GPUS, "Tenant nlp is at its 4-GPU ceiling"),
    ([node("a", gpus=2)], [running(9, gpus=[0, 1], tenant="nlp")], job(1, tenant="nlp"),
     ReasonCode.OVER_QUOTA_CLUSTER_FULL, "is using all of its 2-GPU guarantee, so it must borrow"),
    # (the borrower's tenant has far more usage than nlp: nlp is not behind it)
    ([node("a", gpus=2)],
     [running(9, gpus=[0], tenant="nlp"), running(8, gpus=[1], tenant="busy", opportunistic=True)],
     job(1, tenant="nlp", gpus=2, reserved_since=-700),  # its reservation window is cooling down
     ReasonCode.OVER_QUOTA_CLUSTER_FULL, "has 1 GPU of its 2-GPU guarantee unused, too few for this job"),
    ([node("a", gpus=2)], [running(9, gpus=[0, 1], tenant="cv", opportunistic=True)],
     job(1, tenant="cv", opportunistic_only=True), ReasonCode.OVER_QUOTA_CLUSTER_FULL, "must borrow"),
    ([node("a", gpus=1)], [running(9, gpus=[0], tenant="cv", opportunistic=True)],
     job(1, tenant="nlp", opportunistic_only=True), ReasonCode.NO_SPARE_CAPACITY, "only on spare capacity"),
    ([node("a", gpus=2)], [running(9, gpus=[0, 1], tenant="other")], job(1, tenant="nlp"),
     ReasonCode.WAITING_FOR_FREE_GPUS, "Waiting for 1 GPU"),
    ([node("a", gpus=4, busy=2), node("b", gpus=4, busy=2)], [], job(1, tenant="nlp", gpus=4, max_nodes=1),
     ReasonCode.HOLDING_RESERVATION, "node a is held for it"),
])
def test_pending_job_says_why(nodes, running_, request_, code, words):
    snapshot = cluster(*nodes, tenants=T + [tenant("other", guaranteed=2, max_gpus=2), tenant("busy", usage=1e7)],
                       running=running_, pending=[request_])
    (pending,) = decide(snapshot, now=0).pending
    assert pending.reason.code == code
    assert words in pending.reason.message
    assert pending.as_dict()["code"] == str(code)


def test_job_behind_lower_usage_tenants_says_so():
    snapshot = cluster(node("a", gpus=1), tenants=[tenant("light", usage=0.0), tenant("heavy", usage=1e7)],
                       pending=[job(1, tenant="heavy"), job(2, tenant="light")])
    pending = pending_of(decide(snapshot, now=0), 1)
    assert pending.reason.code == ReasonCode.BEHIND_LOWER_USAGE_TENANTS
    assert ("Tenants with lower or about the same recent usage as heavy (per unit of weight) are borrowing"
            in pending.reason.message)
    assert pending.reason.details == {"tenant": "heavy"}


def test_tenants_level_in_usage_taking_turns_to_borrow_are_each_told_the_same_every_turn():
    """Each placement pushes its tenant back in the borrowing order, so two tenants level in usage
    take turns. Whichever is a little ahead this turn, each one's waiting jobs are told they wait
    behind tenants as low in usage, not that the cluster is full one turn and behind the next
    (which rewrote every waiting job of both, each turn)."""
    def told(usage_a: float, usage_b: float) -> dict[str, str]:
        snapshot = cluster(node("n", gpus=2), tenants=[tenant("a", usage=usage_a), tenant("b", usage=usage_b)],
                           running=[running(8, on="n", gpus=[0], tenant="a", opportunistic=True),
                                    running(9, on="n", gpus=[1], tenant="b", opportunistic=True)],
                           pending=[job(1, tenant="a"), job(2, tenant="b")])
        decisions = decide(snapshot, now=0)
        return {"a": pending_of(decisions, 1).reason, "b": pending_of(decisions, 2).reason}

    a_ahead, b_ahead = told(1.00e6, 1.02e6), told(1.02e6, 1.00e6)
    assert a_ahead == b_ahead
    assert {reason.code for reason in a_ahead.values()} == {ReasonCode.BEHIND_LOWER_USAGE_TENANTS}
    # (one clearly ahead is still told the cluster is full: nobody borrows as low as it)
    assert told(1e6, 2e6)["a"].code == ReasonCode.OVER_QUOTA_CLUSTER_FULL


def test_behind_lower_usage_tenants_reads_the_same_whichever_of_them_borrowed_this_cycle():
    """The verdict is stored for every waiting job and rewritten wherever a word of it changes: how
    many tenants happened to borrow in one cycle, or the last decimal of a drifting usage, must not
    rewrite it for a job whose situation did not change."""
    tenants = [tenant("light", usage=0.0), tenant("lighter", usage=0.0)]

    def verdict(heavy_usage: float, *borrowers: str):
        snapshot = cluster(node("a", gpus=len(borrowers)), tenants=tenants + [tenant("heavy", usage=heavy_usage)],
                           pending=[job(1, tenant="heavy")]
                           + [job(10 + i, tenant=t) for i, t in enumerate(borrowers)])
        decisions = decide(snapshot, now=0)
        assert len(decisions.placements) == len(borrowers)
        return pending_of(decisions, 1).reason

    one = verdict(1e7, "light")
    assert one.code == ReasonCode.BEHIND_LOWER_USAGE_TENANTS
    assert verdict(1e7 + 3600, "light", "lighter") == one


def test_behind_lower_usage_tenants_holds_in_a_cycle_where_nothing_frees_up_too():
    """Whether a GPU happened to free up and go to the lighter tenant this cycle does not change
    why the heavy tenant's job waits: the lighter one holds the borrowed GPUs either way. (Before,
    the verdict flipped to 'over quota, cluster full' on every quiet cycle and back on every busy
    one, rewriting it for every such job each time.)"""
    tenants = [tenant("light", usage=0.0), tenant("heavy", usage=1e7)]
    borrowed = [running(90, gpus=[0], tenant="light", opportunistic=True),
                running(91, gpus=[1], tenant="light", opportunistic=True)]
    quiet = decide(cluster(node("a", gpus=2), tenants=tenants, running=borrowed, pending=[job(1, tenant="heavy")]),
                   now=0)
    busy = decide(cluster(node("a", gpus=3), tenants=tenants, running=borrowed,
                          pending=[job(1, tenant="heavy"), job(2, tenant="light")]), now=0)
    assert [p.job_id for p in busy.placements] == [2] and not quiet.placements
    assert pending_of(quiet, 1).reason == pending_of(busy, 1).reason
    assert pending_of(quiet, 1).reason.code == ReasonCode.BEHIND_LOWER_USAGE_TENANTS


def test_every_pending_job_gets_exactly_one_decision():
    jobs = [job(i, tenant=("nlp", "cv", "x")[i % 3], gpus=1 + i % 4) for i in range(1, 40)]
    decisions = decide(cluster(node("a", gpus=8), node("b", gpus=4), tenants=T, pending=jobs), now=0)
    decided = [p.job_id for p in decisions.placements] + [p.job_id for p in decisions.pending]
    assert sorted(decided) == list(range(1, 40))


@pytest.mark.parametrize("ends, needed, eta", [
    ([100.0, 200.0], 1, 50.0),    # the first release
    ([100.0, 200.0], 2, 150.0),   # both must end
    ([100.0, None], 2, None),     # one end unknown: no estimate
    ([30.0], 1, 0.0),             # overdue counts as now
])
def test_eta_is_when_enough_gpus_are_released(ends, needed, eta):
    snapshot = cluster(node("a", gpus=len(ends)), tenants=[tenant("nlp", guaranteed=4), tenant("other", guaranteed=4)],
                       running=[running(10 + i, gpus=[i], tenant="other", started_at=0.0, runtime=end)
                                for i, end in enumerate(ends)],
                       pending=[job(1, tenant="nlp", gpus=needed)])
    assert pending_of(decide(snapshot, now=50), 1).eta_s(50) == eta


def test_eta_counts_the_queue_ahead():
    snapshot = cluster(node("a", gpus=3), tenants=[tenant("nlp", guaranteed=4), tenant("other", guaranteed=3)],
                       running=[running(10 + i, gpus=[i], tenant="other", started_at=0.0, runtime=100.0 * (i + 1))
                                for i in range(3)],
                       pending=[job(1, tenant="nlp", submitted_at=1), job(2, tenant="nlp", submitted_at=2)])
    decisions = decide(snapshot, now=0)
    assert [pending_of(decisions, i).eta_at for i in (1, 2)] == [100.0, 200.0]


def test_impossible_requests_have_no_eta():
    snapshot = cluster(node("a", mem_gib=32), tenants=T, pending=[job(1, tenant="nlp", mem_gib=40)])
    assert decide(snapshot, now=0).pending[0].eta_at is None


def test_the_borrowing_pass_stops_searching_at_the_search_limit_and_says_so():
    """The borrowing pass reads whether searches are left once per search, not once per job: the
    job after the last search allowed is told it was not considered, not searched for."""
    from jobs.scheduling.config import SchedulerConfig

    snapshot = cluster(node("a", gpus=8), tenants=[tenant("nlp", guaranteed=0)],
                       pending=[job(1, tenant="nlp", gpus=1), job(2, tenant="nlp", gpus=2),
                                job(3, tenant="nlp", gpus=4), job(4, tenant="nlp", gpus=1)])
    decisions = decide(snapshot, now=10, config=SchedulerConfig(max_placement_searches=2))
    assert sorted(placed(decisions)) == [1, 2]
    assert codes(decisions) == {3: "not_considered", 4: "not_considered"}


def test_a_carried_cycle_tells_an_unchanged_verdict_with_the_very_reason_it_told_before():
    """The scheduling loop finds the verdicts to rewrite by comparing two cycles' verdicts, mostly
    by identity: a reason whose words stay the same (a tenant's usage drifting, a ceiling the
    tenant is still at) must come back as the same object, and new words as new."""
    from jobs.scheduling.carry import Carry

    def snapshot(heavy_usage: float, ceiling: int = 1):
        return cluster(node("a", gpus=2), tenants=[tenant("light"), tenant("heavy", usage=heavy_usage),
                                                   tenant("capped", max_gpus=ceiling)],
                       running=[running(90, gpus=[0], tenant="light", opportunistic=True),
                                running(91, gpus=[1], tenant="capped", opportunistic=True)],
                       pending=[job(1, tenant="heavy"), job(2, tenant="capped")])

    carry = Carry()
    first = decide(snapshot(1e7), now=0, carry=carry)
    again = decide(snapshot(1e7 + 3600), now=2, carry=carry)
    for job_id in (1, 2):
        assert pending_of(again, job_id).reason is pending_of(first, job_id).reason
    assert pending_of(first, 2).reason.code == ReasonCode.AT_MAX_GPUS
    heavier = decide(snapshot(2e7), now=4, carry=carry)  # (still behind the lighter tenant: same words)
    for job_id in (1, 2):
        assert pending_of(heavier, job_id).reason is pending_of(first, job_id).reason
    raised = decide(snapshot(2e7, ceiling=2), now=6, carry=carry)
    assert raised == decide(snapshot(2e7, ceiling=2), now=6)
    assert pending_of(raised, 2).reason.code != ReasonCode.AT_MAX_GPUS
    assert pending_of(raised, 1).reason is pending_of(first, 1).reason
