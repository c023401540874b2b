"""The borrowing pass settles most jobs many at a time, by the answer the first job of their memo
key got (``jobs.scheduling.borrowing``). That must change no decision: on random long queues of
few distinct requests (as 50,000 pending jobs are), with young gangs, jobs that may backfill a
hold, arrays, members at their user limits, a small search budget and ETAs that run out, over
cycles that keep a carry, the decisions equal those of settling every job one by one."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jobs.scheduling import ClusterSnapshot, Promise, SchedulerConfig, UserLimit, decide
from jobs.scheduling import carry as carry_module
from jobs.scheduling.carry import Carry
from jobs.scheduling.borrowing import BorrowingPass
from tests.scheduling.builders import cluster, job, node, nodes, running, tenant
from tests.scheduling.test_invariants import launch, requests, warm_clusters

NOW = 1200.0
CONFIGS = [SchedulerConfig(), SchedulerConfig(max_placement_searches=3), SchedulerConfig(gang_single_node_wait_s=0.0),
           SchedulerConfig(gang_reservation_max_s=0.0)]


def one_by_one(snapshot: ClusterSnapshot, now: float, config: SchedulerConfig):
    BorrowingPass.settle_in_bulk = False
    try:
        return decide(snapshot, now, config)
    finally:
        BorrowingPass.settle_in_bulk = True


@st.composite
def long_queues(draw, first_id: int, names: list[str]):
    """Copies of a few requests under new ids: older and younger than the wait for one node, some
    expected to end soon (they may backfill a hold), some in an array, from two members."""
    templates = draw(requests(first_id, names, 5))
    assume(templates)
    queue = []
    for i in range(draw(st.integers(8, 70))):
        template = draw(st.sampled_from(templates))
        array = draw(st.sampled_from([None, None, None, (7, 1), (8, 2)]))
        queue.append(dataclasses.replace(
            template, id=first_id + 100 + i, priority=draw(st.integers(0, 1)),
            user=draw(st.sampled_from(["ann", "bob"])),
            submitted_at=draw(st.sampled_from([10.0, NOW - 300.0, NOW - 100.0 + i])),
            expected_runtime_s=draw(st.sampled_from([None, template.expected_runtime_s, 30.0, 5000.0])),
            array_id=array and array[0], array_limit=array and array[1]))
    return queue


def user_limits(draw, names: list[str]) -> tuple[UserLimit, ...]:
    return tuple(UserLimit(tenant=name, user="ann", max_running=draw(st.sampled_from([None, 0, 1])),
                           max_gpus=draw(st.sampled_from([None, 1, 3])))
                 for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=2)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_settling_in_bulk_decides_as_settling_one_by_one(data):
    draw = data.draw
    snapshot = draw(warm_clusters())
    names = [t.name for t in snapshot.tenants] + ["stranger"]
    snapshot = dataclasses.replace(snapshot, pending=snapshot.pending + tuple(draw(long_queues(10_000, names))),
                                   user_limits=user_limits(draw, names))
    config, carry, now = draw(st.sampled_from(CONFIGS)), Carry(), NOW
    share = carry_module.MAX_ARRIVED_SHARE
    carry_module.MAX_ARRIVED_SHARE = draw(st.sampled_from([share, 1.0]))  # (1.0: arrivals sorted into the columns)
    try:
        for cycle in range(draw(st.integers(1, 3))):
            decisions = decide(snapshot, now, config, carry)
            assert decisions == one_by_one(snapshot, now, config)
            snapshot = launch(snapshot, decisions, now, draw)
            snapshot = dataclasses.replace(snapshot, pending=snapshot.pending + tuple(
                draw(long_queues(20_000 + 1000 * cycle, names))), promises=decisions.promises)
            now += draw(st.sampled_from([1.0, 250.0]))
    finally:
        carry_module.MAX_ARRIVED_SHARE = share


def test_a_long_queue_waits_with_the_reason_and_the_queue_eta_each_job_would_get_alone():
    # Two GPUs, both busy with a borrower's jobs ending in 100 s and 200 s; 40 jobs of one request
    # queue behind: each is told the same reason, and the first two the ETAs of those two ends.
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("nlp", guaranteed=0), tenant("cv", guaranteed=0)],
                       pending=[job(i, tenant="nlp", submitted_at=float(i)) for i in range(1, 41)])
    warm = launch(snapshot, decide(snapshot, 0.0), 0.0, None)
    warm = dataclasses.replace(warm, running=tuple(
        dataclasses.replace(running, expected_runtime_s=100.0 * (k + 1)) for k, running in enumerate(warm.running)))
    decisions = decide(warm, 0.0)
    assert decisions == one_by_one(warm, 0.0, SchedulerConfig())
    assert len(decisions.pending) == 38
    assert len({p.reason.message for p in decisions.pending}) == 1
    assert [p.eta_at for p in decisions.pending[:3]] == [100.0, 200.0, None]


def test_a_job_deep_in_a_queue_that_kept_its_promise_waits_once_as_reclaiming():
    # nlp's job 6 reclaimed GPU 0 (its borrower is still stopping) and keeps that promise; its
    # guarantee is then spent, so the identical jobs queued around it borrow and wait, each told
    # once, job 6 among them only as the job its GPUs are being freed for.
    snapshot = cluster(
        node("a", gpus=2),
        tenants=[tenant("nlp", guaranteed=1, max_gpus=10), tenant("cv", guaranteed=1)],
        running=[running(50, on="a", gpus=[0], tenant="cv", opportunistic=True, preempting=True),
                 running(51, on="a", gpus=[1], tenant="cv")],
        pending=[job(i, tenant="nlp", submitted_at=float(i)) for i in range(1, 21)])
    gpu0 = snapshot.nodes[0].gpus[0].id
    snapshot = dataclasses.replace(snapshot, promises=(Promise(6, "nlp", (gpu0,)),))
    decisions = decide(snapshot, 100.0)
    assert decisions == one_by_one(snapshot, 100.0, SchedulerConfig())
    told = [p.job_id for p in decisions.pending]
    assert sorted(told) == list(range(1, 21))
    assert next(p for p in decisions.pending if p.job_id == 6).reason.code == "reclaiming"
    assert decisions.promises == snapshot.promises


def test_a_runtime_that_is_not_a_number_never_backfills_nor_stops_a_job_behind_it_backfilling():
    # A gang holds node a until the borrower on GPU 0 ends (100 s); of the jobs behind it, the one
    # expected to end within that backfills GPU 1. A runtime that is not a number (a corrupt
    # profile) may not backfill, and must not make the jobs behind it look as if it could.
    snapshot = cluster(node("a", gpus=2), tenants=[tenant("nlp"), tenant("cv")],
                       running=[running(50, on="a", gpus=[0], tenant="cv", opportunistic=True, started_at=900.0,
                                        runtime=200.0)],
                       pending=[job(1, gpus=2, tenant="nlp", max_nodes=1), job(2, tenant="nlp", runtime=float("nan")),
                                job(3, tenant="nlp", runtime=50.0), job(4, tenant="nlp", runtime=10.0)])
    decisions = decide(snapshot, 1000.0)
    assert decisions == one_by_one(snapshot, 1000.0, SchedulerConfig())
    assert [p.job_id for p in decisions.placements] == [3]


def test_when_the_queue_s_etas_run_out_inside_a_run_the_rest_of_the_run_gets_none():
    # 32 busy GPUs end one by one over the next 32 minutes: of 90 identical jobs queued behind
    # them the first 32 are given those ends as ETAs and the rest none, though the ETAs run out
    # in the middle of a run of jobs settled at once.
    snapshot = cluster(*nodes(4, gpus=8), tenants=[tenant("nlp"), tenant("cv")],
                       pending=[job(i, tenant="cv", submitted_at=float(i)) for i in range(1, 33)])
    warm = launch(snapshot, decide(snapshot, 0.0), 0.0, None)
    warm = dataclasses.replace(warm,
                               pending=tuple(job(100 + i, tenant="nlp", submitted_at=float(i)) for i in range(90)),
                               running=tuple(dataclasses.replace(r, expected_runtime_s=60.0 * (k + 1))
                                             for k, r in enumerate(warm.running)))
    decisions = decide(warm, 0.0)
    assert decisions == one_by_one(warm, 0.0, SchedulerConfig())
    etas = [p.eta_at for p in decisions.pending]
    assert etas[:32] == [60.0 * (k + 1) for k in range(32)] and etas[32:] == [None] * 58


def test_a_hold_taken_in_the_middle_of_a_queue_lets_the_jobs_after_it_backfill():
    # (found by review) Gang 1 finds no node free and holds node a until its borrowers end; job 2
    # cannot backfill (no runtime) and is told so, job 3 of the same request is expected to end
    # well before the hold's ETA and must backfill a's free GPUs, not be told job 2's answer.
    borrowers = [running(1000 + i, on="a", gpus=(i,), tenant="o", runtime=1600.0) for i in range(4)]
    borrowers += [running(1100 + i, on="b", gpus=(i,), tenant="o", runtime=1600.0) for i in range(8)]
    pending = [job(1, gpus=8, max_nodes=1, tenant="t", submitted_at=1.0), job(2, tenant="t", submitted_at=2.0),
               job(3, tenant="t", submitted_at=3.0, runtime=30.0)]
    pending += [job(10 + i, tenant="t", submitted_at=10.0 + i) for i in range(8)]
    pending += [job(30 + i, gpus=8, max_nodes=1, tenant="t", submitted_at=30.0 + i) for i in range(4)]
    snapshot = cluster(node("a"), node("b"), pending=pending, running=borrowers,
                       tenants=[tenant("o", guaranteed=16), tenant("t")])
    decisions = decide(snapshot, 1000.0)
    assert decisions == one_by_one(snapshot, 1000.0, SchedulerConfig())
    assert [p.job_id for p in decisions.placements] == [3]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_holds_and_backfill_decide_in_bulk_as_one_by_one(data):
    """Full nodes whose borrowers end at known times, and a long queue of gangs (which hold a node
    when blocked) and single jobs with and without runtimes short enough to backfill that hold:
    the order in which a hold arrives among the jobs of one request is what bulk settling must
    follow."""
    draw = data.draw
    count = draw(st.integers(1, 3))
    borrowers, next_id = [], 1000
    for n in range(count):
        for gpu in range(4):
            if draw(st.booleans()) or gpu < 2:
                borrowers.append(running(next_id, on=f"n{n}", gpus=(gpu,), tenant="o",
                                         runtime=draw(st.sampled_from([None, 120.0, 1600.0]))))
                next_id += 1
    kinds = {"gang": dict(gpus=4, max_nodes=1), "single": {}, "short": dict(runtime=30.0), "long": dict(runtime=9000.0)}
    pending = [job(i + 1, tenant=draw(st.sampled_from(["t", "u"])), submitted_at=float(draw(st.integers(1, 5))),
                   priority=draw(st.integers(0, 1)), **kinds[draw(st.sampled_from(sorted(kinds)))])
               for i in range(draw(st.integers(8, 60)))]
    snapshot = cluster(*[node(f"n{n}", gpus=4) for n in range(count)], pending=pending, running=borrowers,
                       tenants=[tenant("o", guaranteed=12), tenant("t"), tenant("u")])
    config = draw(st.sampled_from(CONFIGS))
    assert decide(snapshot, 1000.0, config) == one_by_one(snapshot, 1000.0, config)
