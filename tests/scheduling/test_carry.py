"""A carry changes no decision: over random histories of cycles (placements launched, jobs ending,
submissions, edits, dependencies resolved, ceilings, cordons, nodes lost, config changes, the
loader handing back its rows in another order), ``decide`` with the carry the earlier cycles left
gives exactly what ``decide`` without one gives on the same snapshot."""

from __future__ import annotations

import dataclasses
import operator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling import ClusterSnapshot, SchedulerConfig, decide
from jobs.scheduling.carry import Carry
from tests.scheduling.builders import job, readings
from tests.scheduling.test_invariants import check_invariants, launch, nodes, requests, tenants, warm_clusters

EVENTS = ["launch", "launch", "end", "submit", "submit", "edit", "edit", "resolve", "ceiling", "cordon", "offline",
          "lose_node", "config", "reorder", "nothing"]
CONFIGS = [SchedulerConfig(), SchedulerConfig(gang_single_node_wait_s=0.0),
           SchedulerConfig(share_memory_headroom_mib=0),
           SchedulerConfig(max_placement_searches=2)]  # (searches are counted by shape identity)


def step(draw, snapshot: ClusterSnapshot, decisions, event: str, now: float, next_id: int):
    """The next cycle's snapshot after ``event`` (jobs left alone stay the very same objects, as
    the snapshot loader keeps them)."""
    names = sorted({t.name for t in snapshot.tenants} | {"stranger"})
    if event == "launch":  # (some victims take their grace to stop: their GPUs stay promised)
        preempted = [p.job_id for p in decisions.preemptions]
        stopping = set(draw(st.lists(st.sampled_from(preempted), unique=True))) if preempted else set()
        launched = launch(snapshot, dataclasses.replace(decisions, preemptions=tuple(
            p for p in decisions.preemptions if p.job_id not in stopping)), now, draw)
        return dataclasses.replace(launched, running=tuple(
            dataclasses.replace(j, preempting=True) if j.id in stopping else j for j in launched.running))
    if event == "end" and snapshot.running:
        ended = set(draw(st.lists(st.sampled_from([j.id for j in snapshot.running]), max_size=3)))
        return dataclasses.replace(snapshot, running=tuple(j for j in snapshot.running if j.id not in ended))
    if event == "submit":  # (submit times tie now and then: the queue order falls back on ids)
        submitted = [dataclasses.replace(j, submitted_at=draw(st.sampled_from([1.0, 2.0, j.submitted_at])))
                     for j in draw(requests(next_id, names, 4))]
        return dataclasses.replace(snapshot, pending=snapshot.pending + tuple(submitted))
    if event == "edit" and snapshot.pending:
        index = draw(st.integers(0, len(snapshot.pending) - 1))
        edited = dataclasses.replace(snapshot.pending[index], priority=draw(st.integers(-1, 3)),
                                     gpus=draw(st.sampled_from([1, 2, 8])), gpu_milli=1000,
                                     submitted_at=draw(st.sampled_from([1.0, snapshot.pending[index].submitted_at])))
        return dataclasses.replace(snapshot,
                                   pending=snapshot.pending[:index] + (edited,) + snapshot.pending[index + 1:])
    if event == "resolve":
        blocked = job(next_id, tenant=draw(st.sampled_from(names)), waiting_for=((1, "ok"),))
        pending = tuple(dataclasses.replace(j, waiting_for=()) if j.waiting_for else j for j in snapshot.pending)
        return dataclasses.replace(snapshot, pending=pending + (blocked,) * draw(st.booleans()))
    if event == "ceiling" and snapshot.tenants:
        index = draw(st.integers(0, len(snapshot.tenants) - 1))
        changed = dataclasses.replace(snapshot.tenants[index], max_gpus=draw(st.integers(0, 8)))
        return dataclasses.replace(snapshot,
                                   tenants=snapshot.tenants[:index] + (changed,) + snapshot.tenants[index + 1:])
    if event == "cordon":
        index = draw(st.integers(0, len(snapshot.nodes) - 1))
        changed = dataclasses.replace(snapshot.nodes[index], cordoned=not snapshot.nodes[index].cordoned)
        return dataclasses.replace(snapshot, nodes=snapshot.nodes[:index] + (changed,) + snapshot.nodes[index + 1:])
    if event == "offline":
        index = draw(st.integers(0, len(snapshot.nodes) - 1))
        changed = dataclasses.replace(snapshot.nodes[index], online=not snapshot.nodes[index].online)
        return dataclasses.replace(snapshot, nodes=snapshot.nodes[:index] + (changed,) + snapshot.nodes[index + 1:])
    if event == "lose_node" and len(snapshot.nodes) > 1:
        lost = snapshot.nodes[-1]
        gone = {g.id for g in lost.gpus}
        return dataclasses.replace(snapshot, nodes=snapshot.nodes[:-1],
                                   running=tuple(j for j in snapshot.running if not gone & set(j.gpu_ids)))
    if event == "reorder":
        return dataclasses.replace(snapshot, pending=tuple(draw(st.permutations(snapshot.pending))))
    return snapshot


def advance(draw, snapshot: ClusterSnapshot, decisions, events: list[str], config: SchedulerConfig, now: float,
            next_id: int) -> tuple[ClusterSnapshot, SchedulerConfig, float, int]:
    """The next cycle's snapshot, config, clock and first free job id, after an event drawn from
    ``events``; the service keeps the promises for the next cycle, whatever happened meanwhile."""
    event = draw(st.sampled_from(events))
    if event == "config":
        config = draw(st.sampled_from(CONFIGS))
    snapshot = dataclasses.replace(step(draw, snapshot, decisions, event, now, next_id), promises=decisions.promises)
    return snapshot, config, now + draw(st.sampled_from([1.0, 30.0, 600.0])), next_id + 10


def check_promises(snapshot: ClusterSnapshot, decisions) -> None:
    """No GPU promised twice, each promise the size of its job, and none both promised and placed
    unless the promise is new and for a fraction of a GPU where a fraction was placed earlier in
    the cycle (the reclaim counted it; a GPU promised from an earlier cycle takes nobody else, nor
    does a GPU once the reclaim promised it)."""
    promised = [gpu for promise in decisions.promises for gpu in promise.gpu_ids]
    assert len(promised) == len(set(promised))
    requests = {job.id: job for job in snapshot.pending}
    assert all(len(promise.gpu_ids) == requests[promise.job_id].gpus for promise in decisions.promises)
    placed_on = {gpu: place.job_id for place in decisions.placements for gpu in place.gpu_ids}
    earlier = {promise.job_id for promise in snapshot.promises}
    for promise in decisions.promises:
        for gpu in set(promise.gpu_ids) & set(placed_on):
            assert promise.job_id not in earlier
            assert requests[promise.job_id].gpu_milli < 1000 and requests[placed_on[gpu]].gpu_milli < 1000


def queues(carry: Carry) -> dict:
    """Each tenant's queue as the next cycle starts from it: the order, the waits, the smallest ask,
    and which entries share one ``Outcome`` (the memo's key: by the first entry holding it)."""
    def sharing(entries) -> list[int]:
        first: dict[int, int] = {}
        return [first.setdefault(id(entry[3]), position) for position, entry in enumerate(entries)]

    return {tenant: ([(entry[0].id, entry[2]) for entry in queue.queue], queue.waits, queue.smallest_guaranteed_ask,
                     sharing(queue.queue))
            for tenant, queue in carry.queues.items()}


def check_columns(carry: Carry) -> None:
    """The columns a carried queue kept (and sorted its arrivals into) give the memo keys that
    columns read afresh from that queue give, whatever the clock and the hold."""
    from jobs.scheduling.carry import QueueColumns

    for queue in carry.queues.values():
        columns = queue.columns
        if columns is None:
            continue
        fresh = QueueColumns(queue.queue)
        assert (columns.ids, columns.needs) == (fresh.ids, fresh.needs)
        assert all(kept is read for kept, read in zip(columns.outcomes, fresh.outcomes))
        alone, cached = object(), columns._keys
        # (each side of the one-node wait's end for some gangs, and each side of some runtimes)
        nows = {1000.0, 5000.0, *(at + 300.0 + side for at in fresh.gang_submitted[::3] for side in (-0.5, 0.5))}
        untils = {None, 0.0, 1e9, *(runtime + side for runtime in fresh.backfill_runtimes[::3] for side in (-0.5, 0.5))}
        for now in sorted(nows):
            for backfill_until in sorted(untils, key=lambda until: -1.0 if until is None else until):
                kept = columns.keys(now, 300.0, backfill_until, (), alone)
                read = fresh.keys(now, 300.0, backfill_until, (), alone)
                assert len(kept) == len(read) and all(a is b for a, b in zip(kept, read))
        columns._keys = cached


def hint_step(carry: Carry, before: tuple, after: tuple) -> None:
    """Tell ``carry`` how ``after`` was made from ``before``, as the snapshot loader would, where
    both are by job id as the loader's are: the jobs whose request is not the very same object."""
    if all(a.id < b.id for pending in (before, after) for a, b in zip(pending, pending[1:])):
        was, now = {j.id: j for j in before}, {j.id: j for j in after}
        changed = {i for i in was.keys() | now.keys() if was.get(i) is not now.get(i)}
        carry.pending_step(before, after, frozenset(changed))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decisions_with_a_carry_equal_decisions_without(data):
    from jobs.scheduling import carry as carry_module

    draw = data.draw
    bound, share, rechecked = carry_module.MAX_SHAPES, carry_module.MAX_ARRIVED_SHARE, carry_module.MAX_RECHECKED_SHAPES
    shared = carry_module.SHARED_KEY_JOBS
    # Now and then the carry starts again from nothing, as past its bounds in a long-lived process;
    # and queues as short as these are sorted into as well as rebuilt.
    carry_module.MAX_SHAPES = draw(st.sampled_from([bound, 3]))
    carry_module.MAX_RECHECKED_SHAPES = draw(st.sampled_from([rechecked, 2]))
    carry_module.MAX_ARRIVED_SHARE = draw(st.sampled_from([share, 1.0]))
    carry_module.SHARED_KEY_JOBS = draw(st.sampled_from([shared, 0]))  # (0: every queue has columns to carry)
    try:
        node_states = draw(nodes())
        snapshot = ClusterSnapshot(nodes=tuple(node_states), tenants=tuple(draw(tenants())), pending=(),
                                   readings=readings(node_states))
        names = [t.name for t in snapshot.tenants] + ["stranger"]
        snapshot = dataclasses.replace(snapshot, pending=tuple(draw(requests(1, names, 12))))
        carry, config, now, next_id = Carry(), CONFIGS[0], 1000.0, 100
        for _ in range(draw(st.integers(2, 7))):
            decisions = decide(snapshot, now, config, carry)
            fresh = Carry()
            assert decisions == decide(snapshot, now, config, fresh)
            assert queues(carry) == queues(fresh)  # (what the next cycle starts from)
            check_columns(carry)
            check_promises(snapshot, decisions)
            before = snapshot.pending
            snapshot, config, now, next_id = advance(draw, snapshot, decisions, EVENTS, config, now, next_id)
            if draw(st.booleans()):
                hint_step(carry, before, snapshot.pending)
    finally:
        carry_module.MAX_SHAPES, carry_module.MAX_ARRIVED_SHARE = bound, share
        carry_module.MAX_RECHECKED_SHAPES, carry_module.SHARED_KEY_JOBS = rechecked, shared


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_reclaim_promises_kept_over_cycles_hold_every_invariant_with_a_carry_as_without(data):
    """Clusters mostly borrowed, where reclaims happen: the promises go round as the service keeps
    them, some victims take their grace to stop, and whatever else happens between cycles a
    promised GPU is never given to anyone else nor promised twice."""
    draw = data.draw
    snapshot, carry, config, now, next_id = draw(warm_clusters()), Carry(), CONFIGS[0], 1000.0, 5000
    for _ in range(draw(st.integers(2, 6))):
        decisions = decide(snapshot, now, config, carry)
        assert decisions == decide(snapshot, now, config, Carry())
        check_invariants(snapshot, decisions)
        check_promises(snapshot, decisions)
        snapshot, config, now, next_id = advance(draw, snapshot, decisions, EVENTS + ["launch"] * 4, config, now,
                                                 next_id)


def test_a_queue_that_only_lost_jobs_is_kept_not_rebuilt():
    """The cheap path is taken where it should be (else the carry would be correct but no faster)."""
    from tests.scheduling.builders import cluster, node, tenant

    snapshot = cluster(node("a", gpus=1), tenants=[tenant("nlp", guaranteed=1)],
                       pending=[job(i, tenant="nlp") for i in range(1, 6)])
    carry = Carry()
    first = decide(snapshot, 0.0, carry=carry)
    placed = {p.job_id for p in first.placements}
    assert placed == {1}
    queue = carry.queues["nlp"].queue
    later = dataclasses.replace(snapshot, pending=tuple(j for j in snapshot.pending if j.id not in placed))
    decide(later, 1.0, carry=carry)
    kept = carry.queues["nlp"].queue
    assert [entry[0].id for entry in kept] == [2, 3, 4, 5]
    assert all(new is old for new, old in zip(kept, queue[1:]))  # the same entries, not rebuilt


def test_a_queue_that_gained_a_few_jobs_keeps_its_entries_and_sorts_the_new_ones_in():
    """What a busy cluster sees every cycle: a few submissions to a long queue (and an edit, which
    hands back a new request under a known id) are sorted in, not the whole queue again."""
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", submitted_at=float(i)) for i in range(1, 17)]
    snapshot = cluster(node("a", gpus=1, busy=1), tenants=[tenant("nlp", max_gpus=4)], pending=queued)
    carry = Carry()
    decide(snapshot, 20.0, carry=carry)
    entries = {entry[0].id: entry for entry in carry.queues["nlp"].queue}
    edited = dataclasses.replace(queued[5], priority=1)
    later = dataclasses.replace(snapshot, pending=(
        *queued[:5], edited, *queued[6:], job(20, tenant="nlp", priority=2, submitted_at=19.0),
        job(21, tenant="nlp", submitted_at=0.5), job(22, tenant="nlp", gpus=8)))
    carried = decide(later, 21.0, carry=carry)
    assert carried == decide(later, 21.0)
    queue = carry.queues["nlp"]
    assert [entry[0].id for entry in queue.queue] == [20, 6, 21, 1, 2, 3, 4, 5, *range(7, 17)]
    assert all(entry is entries[entry[0].id] for entry in queue.queue if entry[0].id not in (6, 20, 21))
    assert [wait.job_id for wait in queue.waits] == [22]  # more than the tenant may ever hold
    # Requests of one shape and class share one memo key, old and new alike.
    assert len({id(entry[3]) for entry in queue.queue}) == 1


def test_arrivals_are_sorted_into_the_carried_columns_as_a_fresh_read_would_have_them():
    """A long queue settled in bulk keeps its columns when jobs arrive: gangs (young and old),
    jobs with a runtime (a NaN one too) and array jobs are sorted in, and the memo keys, the
    decisions and the columns are what a queue read afresh gives."""
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", gpus=1 + i % 2, runtime=(None, 30.0, 4000.0)[i % 3], submitted_at=100.0 + i)
              for i in range(1, 41)]
    snapshot = cluster(node("a", gpus=2, busy=2), node("b", gpus=2, busy=2), tenants=[tenant("nlp", max_gpus=8)],
                       pending=queued)
    carry = Carry()
    decide(snapshot, 500.0, carry=carry)
    assert carry.queues["nlp"].columns is not None  # (settled in bulk: few requests, many jobs)
    entries = {entry[0].id: entry for entry in carry.queues["nlp"].queue}
    arrivals = (job(50, tenant="nlp", gpus=2, submitted_at=480.0), job(51, tenant="nlp", gpus=2, submitted_at=50.0),
                job(52, tenant="nlp", runtime=10.0, submitted_at=490.0),
                job(53, tenant="nlp", runtime=float("nan"), submitted_at=20.0),
                job(54, tenant="nlp", gpus=2, array=(9, 1), runtime=30.0, priority=1))
    later = dataclasses.replace(snapshot, pending=(*queued, *arrivals))
    carried = decide(later, 501.0, carry=carry)
    assert carried == decide(later, 501.0)
    queue = carry.queues["nlp"]
    assert all(entry is entries[entry[0].id] for entry in queue.queue if entry[0].id < 50)  # sorted in, not rebuilt
    assert queue.columns is not None and set(queue.columns.gang_ids) >= {50, 51, 54}
    check_columns(carry)


def test_a_queue_of_equal_copies_of_its_jobs_is_read_again_not_taken_for_the_same_jobs():
    """The loader builds every request again (equal, new objects) when what they are built from
    changes: the queue's entries hold the old objects, so the copies are arrivals, not its jobs
    (taken for its jobs, the next cycle a job left in dropped every entry; review)."""
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", submitted_at=float(i)) for i in range(1, 17)]
    snapshot = cluster(node("a", gpus=1, busy=1), tenants=[tenant("nlp", max_gpus=4)], pending=queued)
    carry = Carry()
    decide(snapshot, 20.0, carry=carry)
    copies = [dataclasses.replace(queued_job) for queued_job in queued]
    again = dataclasses.replace(snapshot, pending=(*copies, job(30, tenant="nlp", submitted_at=30.0)))
    assert decide(again, 21.0, carry=carry) == decide(again, 21.0)
    freed = dataclasses.replace(again, nodes=(dataclasses.replace(snapshot.nodes[0], gpus=tuple(
        dataclasses.replace(gpu, busy=False) for gpu in snapshot.nodes[0].gpus)),), pending=again.pending[1:])
    carried = decide(freed, 22.0, carry=carry)
    assert carried == decide(freed, 22.0) and [p.job_id for p in carried.placements] == [2]
    assert [entry[0].id for entry in carry.queues["nlp"].queue] == [*range(2, 17), 30]


def test_a_job_edited_in_a_queue_with_columns_is_keyed_by_its_new_request_not_its_old_one(monkeypatch):
    """A young gang expected to end soon, edited to one GPU without a runtime, comes back under its
    id: its old self's place among the gangs and the jobs that may backfill is not its own (review)."""
    from jobs.scheduling import carry as carry_module
    from tests.scheduling.builders import cluster, node, tenant

    monkeypatch.setattr(carry_module, "SHARED_KEY_JOBS", 0)  # (columns for every queue)
    queued = [job(i, tenant="nlp", gpus=2, runtime=30.0, submitted_at=480.0 + i) for i in range(1, 9)]
    snapshot = cluster(node("a", gpus=2, busy=2), node("b", gpus=2, busy=2), tenants=[tenant("nlp", max_gpus=8)],
                       pending=queued)
    carry = Carry()
    decide(snapshot, 500.0, carry=carry)
    edited = dataclasses.replace(queued[2], gpus=1, expected_runtime_s=None)
    later = dataclasses.replace(snapshot, pending=(*queued[:2], edited, *queued[3:]))
    assert decide(later, 501.0, carry=carry) == decide(later, 501.0)
    columns = carry.queues["nlp"].columns
    assert 3 in columns.ids and 3 not in columns.gang_ids and 3 not in columns.backfill_ids
    check_columns(carry)


def test_the_ids_of_jobs_gone_do_not_pile_up_in_columns_kept_for_ever():
    """A queue that loses a job and gains one every cycle keeps its columns: what it remembers of
    the jobs gone stays bounded by the jobs queued."""
    from jobs.scheduling.carry import STALE_SLACK
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", gpus=2, runtime=30.0, submitted_at=float(i)) for i in range(1, 41)]
    snapshot = cluster(node("a", gpus=2, busy=2), tenants=[tenant("nlp", max_gpus=8)], pending=queued)
    carry = Carry()
    decide(snapshot, 50.0, carry=carry)
    for cycle in range(1, 200):
        queued = [*queued[1:], job(100 + cycle, tenant="nlp", gpus=2, runtime=30.0, submitted_at=50.0 + cycle)]
        decide(dataclasses.replace(snapshot, pending=tuple(queued)), 50.0 + cycle, carry=carry)
        columns = carry.queues["nlp"].columns
        assert columns is not None and len(columns.gang_ids) <= 2 * len(queued) + STALE_SLACK + 1
    check_columns(carry)


def test_an_edited_job_goes_back_to_its_place_among_jobs_submitted_at_the_same_time():
    """Equal priority and submit time: the id decides, for a job sorted in as for a fresh queue."""
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", submitted_at=5.0) for i in range(1, 17)]
    snapshot = cluster(node("a", gpus=1, busy=1), tenants=[tenant("nlp", max_gpus=4)], pending=queued)
    carry = Carry()
    decide(snapshot, 20.0, carry=carry)
    edited = dataclasses.replace(queued[2], gpu_memory_mib=1024)
    later = dataclasses.replace(snapshot, pending=(*queued[:2], *queued[3:], edited))
    assert decide(later, 21.0, carry=carry) == decide(later, 21.0)
    assert [entry[0].id for entry in carry.queues["nlp"].queue] == list(range(1, 17))
    assert carry.queues["nlp"].queue[2][0] is edited


def test_the_shapes_it_remembers_are_bounded(monkeypatch):
    """A scheduler process lives for months while request keys come and go with the jobs."""
    from jobs.scheduling import carry as carry_module
    from tests.scheduling.builders import cluster, node, tenant

    monkeypatch.setattr(carry_module, "MAX_SHAPES", 5)
    carry = Carry()
    for cycle in range(10):  # each cycle brings requests of new sizes
        snapshot = cluster(node("a", gpus=1), tenants=[tenant("nlp")],
                           pending=[job(10 * cycle + i, tenant="nlp", mem_gib=1 + 10 * cycle + i) for i in range(3)])
        assert decide(snapshot, float(cycle), carry=carry) == decide(snapshot, float(cycle))
        assert len(carry.shapes) <= 5 + 3


def test_after_the_shapes_are_dropped_a_cycle_still_counts_its_searches_as_a_fresh_one(monkeypatch):
    """Shapes are compared by identity: a carried queue holding shapes the table no longer hands
    out would make the cycle search again where a fresh one remembers, and run out of searches."""
    from jobs.scheduling import carry as carry_module
    from tests.scheduling.builders import cluster, node, running, tenant

    monkeypatch.setattr(carry_module, "MAX_SHAPES", 1)
    config = SchedulerConfig(max_placement_searches=3)
    nodes = (node("a", gpus=4, busy=2), node("b", gpus=4, busy=2), node("c", gpus=2))
    tenants = [tenant("ta"), tenant("tb"), tenant("tc")]
    gangs = [job(1, tenant="ta", gpus=4, submitted_at=100.0), job(2, tenant="tb", gpus=4, submitted_at=100.0)]
    carry = Carry()
    first = cluster(*nodes, tenants=tenants, pending=[*gangs, job(3, tenant="tc", submitted_at=100.0)])
    assert decide(first, 110.0, config, carry) == decide(first, 110.0, config)
    later = cluster(*nodes, tenants=tenants,
                    pending=[*gangs, job(4, tenant="tb", submitted_at=111.0, waiting_for=((99, "ok"),)),
                             job(5, tenant="tc", submitted_at=111.0)],
                    running=[running(3, on="c", gpus=[0], tenant="tc", opportunistic=True)])
    carried = decide(later, 112.0, config, carry)
    assert carried == decide(later, 112.0, config)
    assert [p.job_id for p in carried.placements] == [5]


def test_a_reason_naming_the_memory_asked_names_this_jobs_memory():
    """Two requests told the same thing (no GPU that holds them takes work) are told it with their
    own figures, whichever was seen first, in this cycle or an earlier one."""
    from tests.scheduling.builders import cluster, node, tenant

    nodes = (node("small", gpus=2, mem_gib=16), node("big", gpus=2, mem_gib=80, online=False))
    needs_60, needs_40 = job(2, tenant="t", mem_gib=60), job(1, tenant="t", mem_gib=40)
    carry = Carry()
    decide(cluster(*nodes, tenants=[tenant("t")], pending=[needs_60]), 10.0, carry=carry)
    both = cluster(*nodes, tenants=[tenant("t")], pending=[needs_40, needs_60])
    carried = decide(both, 11.0, carry=carry)
    assert carried == decide(both, 11.0)
    messages = {p.job_id: p.reason.message for p in carried.pending}
    assert "40 GiB" in messages[1] and "60 GiB" in messages[2]


def test_one_id_twice_in_the_queue_is_decided_as_a_fresh_cycle_would():
    """Not what the database loader produces, but the core takes any snapshot."""
    from tests.scheduling.builders import cluster, node, tenant

    nodes = (node("a", gpus=1, busy=1),)
    first, again, other = job(1, tenant="t"), job(1, tenant="t", priority=1), job(2, tenant="t")
    for before, after in (([first, again, other], [again]), ([first, other, job(3, tenant="t")], [first, first])):
        carry = Carry()
        decide(cluster(*nodes, tenants=[tenant("t")], pending=before), 10.0, carry=carry)
        snapshot = cluster(*nodes, tenants=[tenant("t")], pending=after)
        assert decide(snapshot, 11.0, carry=carry) == decide(snapshot, 11.0)


def test_a_node_cordoned_keeps_the_queues_unless_a_request_can_no_longer_run_anywhere():
    """Nodes come and go all day on a large cluster: a change that leaves every request as possible
    as it was keeps the carried queues; one that leaves a request nowhere to run tells its jobs so."""
    from tests.scheduling.builders import cluster, node, tenant

    snapshot = cluster(node("a", gpus=2, busy=2, model="A"), node("b", gpus=2, busy=2, model="A"),
                       node("c", gpus=2, busy=2, model="B"), tenants=[tenant("nlp", max_gpus=8)],
                       pending=[job(1, tenant="nlp", models=("A",)), job(2, tenant="nlp", models=("B",)),
                                job(3, tenant="nlp", models=("A",))])
    carry = Carry()
    decide(snapshot, 0.0, carry=carry)
    queue = carry.queues["nlp"]

    def cordoned(*names: str) -> ClusterSnapshot:
        return dataclasses.replace(snapshot, nodes=tuple(dataclasses.replace(n, cordoned=n.name in names)
                                                         for n in snapshot.nodes))

    one_a = cordoned("a")
    assert decide(one_a, 1.0, carry=carry) == decide(one_a, 1.0)
    assert carry.queues["nlp"] is queue  # (model A still has node b: nothing to tell anyone)
    only_b_cordoned = cordoned("c")
    decisions = decide(only_b_cordoned, 2.0, carry=carry)
    assert decisions == decide(only_b_cordoned, 2.0)
    assert carry.queues["nlp"] is not queue
    assert {p.job_id: p.reason.code for p in decisions.pending} == {
        1: "over_quota_cluster_full", 2: "needs_cordoned_nodes", 3: "over_quota_cluster_full"}


def test_the_memo_keys_a_queue_is_built_with_are_those_its_columns_make():
    """A queue built this cycle takes its borrowing memo keys from ``TenantQueues.entries`` (gangs young
    and old, jobs with and without a runtime, an array job): they are the very keys its columns
    make at the cycle's clock without a hold, made for what the columns' own lookup finds."""
    from jobs.scheduling.carry import ALONE, QueueColumns, queue_order
    from jobs.scheduling.cycle import Cycle
    from tests.scheduling.builders import cluster, node, tenant

    queued = [job(i, tenant="nlp", gpus=1 + i % 2, runtime=(None, 30.0, 4000.0)[i % 3], submitted_at=100.0 + 20 * i,
                  array=(7, 2) if i == 5 else None, priority=i % 2) for i in range(1, 41)]
    snapshot = cluster(node("a", gpus=4), tenants=[tenant("nlp", max_gpus=8)], pending=queued)
    now = 700.0  # (gangs submitted before 400 are past their one-node wait of 300 s)
    cycle = Cycle(snapshot, now, SchedulerConfig())
    queue, _, _, read = cycle.tenant_queues.entries("nlp", cycle.inputs.quota("nlp").ceiling_milli,
                                                    sorted(queued, key=queue_order), {})
    seeded = QueueColumns(queue, read)
    seeded.seed_keys(read.keys, read.young_gangs)
    made = QueueColumns(queue)
    keys = made.keys(now, 300.0, None, (), ALONE)
    assert seeded._keys[0] == made._keys[0]
    assert len(read.keys) == len(keys) and all(a is b for a, b in zip(read.keys, keys))
    assert any(key is ALONE for key in keys) and len({id(key) for key in keys}) > 3


def test_a_carried_cycle_tells_a_steady_queue_the_very_verdicts_it_told_before():
    """The scheduling loop finds the verdicts to rewrite by comparing two cycles' verdicts: a
    queue whose situation did not change gets back the very ``Pending`` objects (none built and
    freed again), and one whose situation changed gets what a fresh cycle says."""
    from tests.scheduling.builders import cluster, node, running, tenant

    def snapshot(heavy_usage: float, ceiling: int = 1):
        return cluster(node("a", gpus=1), tenants=[tenant("light"), tenant("heavy", usage=heavy_usage),
                                                   tenant("capped", max_gpus=ceiling)],
                       running=[running(90, gpus=[0], tenant="light", opportunistic=True)],
                       pending=[job(i, tenant="heavy") for i in range(1, 41)]
                       + [job(i, tenant="capped", gpus=2) for i in range(41, 61)])

    carry = Carry()
    first = decide(snapshot(1e7), 10.0, carry=carry)
    again = decide(snapshot(1e7 + 3600), 12.0, carry=carry)  # (usage drifting within its rounding)
    assert again == decide(snapshot(1e7 + 3600), 12.0)
    # (bar the first few of each tenant's run, told one by one before the rest are told in bulk)
    from jobs.scheduling.borrowing import BULK_AFTER
    assert len(again.pending) == 60
    assert sum(map(operator.is_, first.pending, again.pending)) >= 60 - 2 * (BULK_AFTER + 2)
    heavier = decide(snapshot(2e7), 14.0, carry=carry)  # (usage doubled, still behind the lighter tenant)
    assert heavier == decide(snapshot(2e7), 14.0)
    assert sum(map(operator.is_, first.pending, heavier.pending)) >= 60 - 2 * (BULK_AFTER + 2)
    raised = decide(snapshot(2e7, ceiling=3), 16.0, carry=carry)  # (capped's jobs now fit its ceiling)
    assert raised == decide(snapshot(2e7, ceiling=3), 16.0)
    assert {p.reason.code for p in raised.pending if p.job_id > 40}.isdisjoint({"over_max_gpus", "at_max_gpus"})
    assert {p.reason.code for p in first.pending if p.job_id > 40} == {"over_max_gpus"}


def test_a_queue_that_lost_and_gained_jobs_tells_the_rest_the_very_verdicts_and_where_they_were_told():
    """A job leaving a tenant's queue (placed, cancelled) and one joining it move every verdict
    told after them: the jobs that stayed get back the very ``Pending`` objects all the same, and
    ``Decisions.told_at`` says where each was told last cycle, so the loop finds what changed
    without a look at each of them (``jobs.services.apply``)."""
    from jobs.scheduling.borrowing import BULK_AFTER
    from tests.scheduling.builders import cluster, node, running, tenant

    # (the very request objects from one cycle to the next, as the snapshot loader hands them back)
    requests = {i: job(i, tenant="heavy" if i <= 40 or i > 60 else "capped", gpus=1 if i <= 40 else 2)
                for i in range(1, 62)}

    def snapshot(pending: list[int]):
        return cluster(node("a", gpus=1), tenants=[tenant("light"), tenant("heavy", usage=1e7),
                                                   tenant("capped", max_gpus=1)],
                       running=[running(90, gpus=[0], tenant="light", opportunistic=True)],
                       pending=[requests[i] for i in pending])

    carry = Carry()
    queued = list(range(1, 61))
    first = decide(snapshot(queued), 10.0, carry=carry)
    queued.remove(20)  # (the heavy tenant's, told before the capped tenant's jobs)
    queued.remove(45)
    queued.append(61)
    again = decide(snapshot(queued), 12.0, carry=carry)
    assert again == decide(snapshot(queued), 12.0)
    was_at = list(range(len(again.pending)))
    for at, then in again.told_at:
        was_at[at:at + len(then)] = then
    very = [index for index, verdict in enumerate(again.pending) if any(verdict is told for told in first.pending)]
    assert len(very) >= 59 - 2 * (BULK_AFTER + 2) - 1
    assert all(first.pending[was_at[index]] is again.pending[index] for index in very)
    assert any(was_at[index] != index for index in very)  # (the places moved: the hints say where)


def test_a_reason_built_from_an_equal_number_of_another_type_is_worded_as_a_fresh_cycle_words_it():
    """2 == 2.0, but "after 2 placement searches" is not "after 2.0": the reasons a carry hands
    out again are those built from arguments of the same types."""
    from tests.scheduling.builders import cluster, node, tenant

    snapshot = cluster(node("a", gpus=8), tenants=[tenant("nlp")],
                       pending=[job(1, tenant="nlp"), job(2, tenant="nlp", gpus=2), job(3, tenant="nlp", gpus=4),
                                job(4, tenant="nlp")])
    carry = Carry()
    decide(snapshot, 10.0, SchedulerConfig(max_placement_searches=2), carry)
    config = SchedulerConfig(max_placement_searches=2.0)
    carried = decide(snapshot, 12.0, config, carry)
    assert carried == decide(snapshot, 12.0, config)
    assert "after 2.0 placement searches" in carried.pending[-1].reason.message


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_pending_by_tenant_moves_only_the_jobs_the_loader_says_changed(data):
    """Told how the pending requests were made (``Carry.pending_step``), the carry moves those
    jobs only: the same lists, in the same order, as a pass over every job; the other tenants'
    very lists kept (their queues are then known unchanged without a compare)."""
    draw = data.draw
    names = ["a", "b", "c", "d"]
    ids = sorted(draw(st.sets(st.integers(1, 60), max_size=30)))
    before = tuple(job(i, tenant=draw(st.sampled_from(names))) for i in ids)
    carry = Carry()
    old = dict(carry.tenants_of(before))
    gone = set(draw(st.sets(st.sampled_from(ids), max_size=5))) if ids else set()
    edited = {i: job(i, tenant=draw(st.sampled_from(names)), gpus=2)
              for i in draw(st.sets(st.sampled_from(ids), max_size=3))} if ids else {}
    came = {i: job(i, tenant=draw(st.sampled_from(names))) for i in draw(st.sets(st.integers(61, 80), max_size=5))}
    after = tuple(sorted([edited.get(j.id, j) for j in before if j.id not in gone] + list(came.values()),
                         key=operator.attrgetter("id")))
    carry.pending_step(before, after, frozenset(gone | edited.keys() | came.keys()))
    stepped = carry.tenants_of(after)
    whole = Carry().tenants_of(after)
    assert list(stepped.items()) == list(whole.items())
    touched = {j.tenant for j in before if j.id in gone or j.id in edited} | {j.tenant for j in (*edited.values(),
                                                                                               *came.values())}
    assert all(stepped[t] is old[t] for t in stepped if t not in touched)


def test_a_step_from_requests_the_carry_did_not_decide_on_is_a_pass_over_every_job():
    first = (job(1, tenant="a"), job(2, tenant="b"))
    other = (job(1, tenant="a"), job(2, tenant="a"))
    carry = Carry()
    carry.tenants_of(first)
    carry.pending_step(other, other, frozenset())  # (how ``other`` was made, not the requests it decided on)
    assert carry.tenants_of(other) == {"a": list(other)}
