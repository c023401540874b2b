"""Invariants of ``decide`` on random clusters (hypothesis).

States are built the way production builds them: a warm-up cycle on an empty cluster, its
placements turned into running jobs (as the service would launch them) with random ages, runtimes
and live utilisation, then a second cycle with new pending work. The checks below restate the
rules independently of the core's own bookkeeping.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from jobs.scheduling import ClusterSnapshot, JobClass, JobRequest, LiveReadings, RunningJob, SchedulerConfig, decide
from jobs.scheduling.usage import charged_milli
from tests.scheduling.builders import job, node, readings, tenant

CONFIG = SchedulerConfig()
# Sized to keep the whole scheduling suite near ten seconds; CI can raise them with a profile.
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(SETTINGS, max_examples=40)


@st.composite
def nodes(draw, min_nodes=1, allow_trouble=True):
    count = draw(st.integers(min_nodes, 4))
    result = []
    for i in range(count):
        gpus = draw(st.integers(1, 4))
        trouble = draw(st.sampled_from(["ok", "ok", "ok", "cordoned", "busy"])) if allow_trouble else "ok"
        util = draw(st.one_of(st.none(), st.floats(0, 1)))
        result.append(node(f"n{i}", gpus=gpus, mem_gib=draw(st.sampled_from([16, 32, 80])),
                           model=draw(st.sampled_from(["A", "B"])), rack=f"r{i % 2}",
                           cordoned=trouble == "cordoned", busy=1 if trouble == "busy" else 0, util=util))
    return result


@st.composite
def tenants(draw):
    result = []
    for name in draw(st.lists(st.sampled_from(["t1", "t2", "t3"]), min_size=1, max_size=3, unique=True)):
        guaranteed = draw(st.integers(0, 4))
        result.append(tenant(name, guaranteed=guaranteed, max_gpus=guaranteed + draw(st.integers(0, 6)),
                             weight=draw(st.sampled_from([0.5, 1.0, 2.0])), usage=draw(st.floats(0, 1e6))))
    return result


@st.composite
def requests(draw, first_id, tenant_names, max_jobs=10):
    result = []
    for i in range(draw(st.integers(0, max_jobs))):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 6]))
        fraction = gpus == 1 and draw(st.booleans())
        result.append(job(
            first_id + i, tenant=draw(st.sampled_from(tenant_names)), gpus=gpus,
            mem_gib=draw(st.sampled_from([None, 4, 10, 20, 40])), priority=draw(st.integers(0, 2)),
            submitted_at=float(first_id + i), milli=draw(st.sampled_from([250, 500])) if fraction else 1000,
            models=draw(st.sampled_from([(), ("A",), ("B",)])), opportunistic_only=draw(st.booleans()),
            shareable=draw(st.booleans()), profile=draw(st.one_of(st.none(), st.tuples(st.sampled_from([2, 6]),
                                                                                      st.floats(0.05, 0.9)))),
            runtime=draw(st.one_of(st.none(), st.floats(10, 1000))), max_nodes=draw(st.sampled_from([None, 1, 2])),
        ))
    return result


def planned_memory(request: JobRequest, capacity_mib: int) -> int:
    if request.profile:
        return request.profile.peak_memory_mib
    if request.gpu_memory_mib is not None:
        return request.gpu_memory_mib
    return -(-capacity_mib * request.gpu_milli // 1000)


def launch(snapshot: ClusterSnapshot, decisions, now: float, draw) -> ClusterSnapshot:
    """What the service does: evict preempted jobs, launch placements as running jobs."""
    requests_by_id = {j.id: j for j in snapshot.pending}
    capacity = {g.id: g.memory_mib for n in snapshot.nodes for g in n.gpus}
    gone = {p.job_id for p in decisions.preemptions}
    running = [j for j in snapshot.running if j.id not in gone]
    utilisation = {job_id: value for job_id, value in snapshot.readings.jobs.items() if job_id not in gone}
    for place in decisions.placements:
        request = requests_by_id[place.job_id]
        known = draw(st.booleans()) if draw else False
        started_at = now - (draw(st.floats(0, 500)) if draw else 0.0)
        if known:
            utilisation[place.job_id] = draw(st.floats(0, 1))
        running.append(RunningJob(
            id=place.job_id, tenant=request.tenant, job_class=place.job_class, gpu_ids=place.gpu_ids,
            started_at=started_at,
            memory_mib=planned_memory(request, min(capacity[g] for g in place.gpu_ids)),
            gpu_milli=request.gpu_milli, expected_runtime_s=request.expected_runtime_s,
            solo_utilisation=request.profile.mean_utilisation if request.profile else None,
            duty_cycle=draw(st.sampled_from([0.1, 0.5, 1.0])) if draw and place.job_class is JobClass.OPPORTUNISTIC
            else place.duty_cycle, shareable=request.shareable or request.gpu_milli < 1000))
    placed = {p.job_id for p in decisions.placements}
    pending = tuple(j for j in snapshot.pending if j.id not in placed)
    return dataclasses.replace(snapshot, running=tuple(running), pending=pending,
                               readings=LiveReadings(gpus=snapshot.readings.gpus, jobs=utilisation))


@st.composite
def warm_clusters(draw):
    node_states, quotas = draw(nodes()), draw(tenants())
    names = [t.name for t in quotas]
    # Warm-up work comes mostly from a tenant without quota, so the cluster is largely borrowed.
    warm_names = names + ["stranger"] * 3
    empty = ClusterSnapshot(nodes=tuple(node_states), pending=tuple(draw(requests(1, warm_names, 12))),
                            tenants=tuple(quotas), readings=readings(node_states))
    warm = launch(empty, decide(empty, now=0.0, config=CONFIG), now=1000.0, draw=draw)
    running = tuple(dataclasses.replace(j, preempting=draw(st.booleans()) and draw(st.booleans()))
                    for j in warm.running)
    return dataclasses.replace(warm, running=running, pending=tuple(draw(requests(100, names + ["stranger"]))))


def check_invariants(snapshot: ClusterSnapshot, decisions) -> None:
    requests = {j.id: j for j in snapshot.pending}
    running = {j.id: j for j in snapshot.running}
    gpu_of = {g.id: (n, g) for n in snapshot.nodes for g in n.gpus}
    quotas = {t.name: t for t in snapshot.tenants}

    # Every pending job is decided exactly once.
    decided = Counter([p.job_id for p in decisions.placements] + [p.job_id for p in decisions.pending])
    assert decided == Counter(requests.keys())

    # A guaranteed job is never preempted, nor one already stopping.
    for preempt in decisions.preemptions:
        victim = running[preempt.job_id]
        assert victim.job_class is JobClass.OPPORTUNISTIC and not victim.preempting

    memory: dict[int, int] = defaultdict(int)
    guaranteed_milli: dict[int, int] = defaultdict(int)
    residents: dict[int, list] = defaultdict(list)
    for resident in snapshot.running:
        for gpu_id in resident.gpu_ids:
            memory[gpu_id] += gpu_of[gpu_id][1].memory_mib if resident.memory_mib is None else resident.memory_mib
            residents[gpu_id].append(resident)
            if resident.job_class is JobClass.GUARANTEED:
                guaranteed_milli[gpu_id] += resident.gpu_milli

    added_load: dict[int, int] = defaultdict(int)
    held = Counter()
    guaranteed_held = Counter()
    # What each GPU's residents request: a borrower on a GPU they over-commit counts its share of
    # it against the ceiling (``usage.charged_milli``), a guaranteed job its whole request.
    requested: dict[int, int] = defaultdict(int)
    for resident in snapshot.running:
        for gpu_id in resident.gpu_ids:
            requested[gpu_id] += resident.gpu_milli
    for resident in snapshot.running:
        held[resident.tenant] += charged_milli(resident.gpu_milli, [requested[g] for g in resident.gpu_ids],
                                               resident.job_class is JobClass.OPPORTUNISTIC)
        if resident.job_class is JobClass.GUARANTEED:
            guaranteed_held[resident.tenant] += resident.quota_milli

    for place in decisions.placements:
        request = requests[place.job_id]
        gpu_ids = place.gpu_ids
        # Gangs all or nothing, on distinct GPUs of schedulable nodes, within max_nodes.
        assert len(gpu_ids) == len(set(gpu_ids)) == request.gpus
        assert request.max_nodes is None or len(place.slices) <= request.max_nodes
        for node_slice in place.slices:
            for gpu_id, index in zip(node_slice.gpu_ids, node_slice.gpu_indices):
                node_state, gpu = gpu_of[gpu_id]
                assert (node_state.name, gpu.index) == (node_slice.node, index)
                assert node_state.schedulable
                assert not (gpu.busy and not residents[gpu_id])
                assert not request.gpu_models or gpu.model in request.gpu_models
                if request.gpus > 1:
                    assert not residents[gpu_id], "a gang shares no GPU"
                # Compute: spare room for borrowers; guaranteed reservations within one GPU.
                running_here = [j for j in residents[gpu_id] if isinstance(j, RunningJob)]
                if place.job_class is JobClass.OPPORTUNISTIC and residents[gpu_id]:
                    live = snapshot.readings.gpus.get(gpu_id)
                    load = added_load[gpu_id] + (round(live * 1000) if live is not None and running_here
                                                 else sum(_load(j, snapshot.readings.jobs.get(j.id))
                                                          for j in running_here))
                    assert load < CONFIG.max_shared_load_milli
                if place.job_class is JobClass.GUARANTEED:
                    guaranteed_milli[gpu_id] += request.gpu_milli
                    assert guaranteed_milli[gpu_id] <= 1000
                memory[gpu_id] += planned_memory(request, gpu.memory_mib)
                residents[gpu_id].append(request)
                added_load[gpu_id] += _demand(request, place.duty_cycle)
        for gpu_id in gpu_ids:
            requested[gpu_id] += request.gpu_milli
        held[request.tenant] += charged_milli(request.gpu_milli, [requested[g] for g in gpu_ids],
                                              place.job_class is JobClass.OPPORTUNISTIC)
        if place.job_class is JobClass.GUARANTEED:
            assert not request.opportunistic_only
            guaranteed_held[request.tenant] += request.quota_milli

    # No GPU over its memory.
    for gpu_id, used in memory.items():
        assert used <= gpu_of[gpu_id][1].memory_mib, f"GPU {gpu_id} over memory"

    # Quotas: guaranteed use within the guarantee (jobs reclaiming count), total within the ceiling.
    for pending in decisions.pending:
        if pending.reason.code == "reclaiming" and not pending.reason.details.get("borrowed"):
            guaranteed_held[requests[pending.job_id].tenant] += requests[pending.job_id].quota_milli
    placed_tenants = {requests[p.job_id].tenant for p in decisions.placements}
    for name, quota in quotas.items():
        assert guaranteed_held[name] <= quota.guaranteed_milli
        if name in placed_tenants:
            assert held[name] <= quota.ceiling_milli


def _demand(request: JobRequest, duty_cycle: float) -> int:
    """What a placement adds to its GPU's load: as the next cycle reads it back (``_load``)."""
    solo = request.profile.mean_utilisation if request.profile else request.gpu_milli / 1000
    return round(solo * duty_cycle * 1000)


def _load(job: RunningJob, utilisation: float | None) -> int:
    if utilisation is not None:
        return round(utilisation * 1000)
    solo = job.solo_utilisation if job.solo_utilisation is not None else job.gpu_milli / 1000
    return round(solo * job.duty_cycle * 1000)


@SETTINGS
@given(warm_clusters())
def test_decisions_keep_every_invariant(snapshot):
    decisions = decide(snapshot, now=1000.0, config=CONFIG)
    check_invariants(snapshot, decisions)
    # Labels for --hypothesis-show-statistics: are the interesting paths being exercised?
    held = {g for j in snapshot.running for g in j.gpu_ids}
    event("preempts" if decisions.preemptions else "no preempt")
    event("reserves" if decisions.reservations else "no reservation")
    event("throttles" if decisions.throttles else "no throttle")
    event("shares a GPU" if any(g in held for p in decisions.placements for g in p.gpu_ids) else "no sharing")
    event("multi-node" if any(len(p.slices) > 1 for p in decisions.placements) else "single node")


@FEWER
@given(warm_clusters(), st.randoms(use_true_random=False))
def test_decisions_are_deterministic_for_a_snapshot(snapshot, rng):
    decisions = decide(snapshot, now=1000.0, config=CONFIG)
    assert decide(snapshot, now=1000.0, config=CONFIG) == decisions
    shuffled = list(snapshot.pending)
    rng.shuffle(shuffled)
    assert decide(dataclasses.replace(snapshot, pending=tuple(shuffled)), now=1000.0, config=CONFIG) == decisions


@st.composite
def borrowed_clusters(draw, pairs_first: bool = True):
    """Only borrowed work holds the cluster; the owner, within its guarantee, has work pending
    (its pairs queued ahead of its singles unless ``pairs_first`` is False)."""
    node_states = draw(nodes(allow_trouble=False))
    total = sum(len(n.gpus) for n in node_states)
    guarantee = draw(st.integers(1, total))
    quotas = (tenant("owner", guaranteed=guarantee, max_gpus=guarantee), tenant("borrower", guaranteed=0))
    fill = [job(1000 + i, tenant="borrower", gpus=draw(st.sampled_from([1, 1, 2])),
                mem_gib=draw(st.sampled_from([None, 4, 10])), submitted_at=float(i)) for i in range(3 * total)]
    empty = ClusterSnapshot(nodes=tuple(node_states), pending=tuple(fill), tenants=quotas,
                            readings=readings(node_states))
    full = launch(empty, decide(empty, now=0.0), now=500.0, draw=draw)
    # A gang runs on GPUs of one model, so the owner's pairs must fit together: no more of them
    # than the cluster has pairs of one model (three pairs on five GPUs of one model and one of
    # another can never all run). Reclaim leaves room for the pairs queued behind a single
    # (``Reclaimer._breaks``: in any order, 3 seeds x 3,000 examples pass, and 2 seeds x 10,000
    # found only plain placement at fault), but placement is greedy: a single queued first takes
    # a free GPU next to a borrower in the only pair of a model, and the pair then waits for that
    # node rather than reclaim. Only with the pairs first does every job reclaim in the first cycle.
    pairs = sum(count // 2 for count in Counter(g.model for n in node_states for g in n.gpus).values())
    sizes, demand = [], 0
    while demand < guarantee and draw(st.booleans()) or not sizes:
        size = draw(st.sampled_from([1, 2]))
        if demand + size > guarantee or size == 2 and sizes.count(2) + 1 > pairs:
            size = 1
        sizes.append(size)
        demand += size
    if pairs_first:
        sizes.sort(reverse=True)
    owner = tuple(job(1 + i, tenant="owner", gpus=size) for i, size in enumerate(sizes))
    return dataclasses.replace(full, pending=owner)


@settings(SETTINGS, max_examples=60)
@given(borrowed_clusters())
def test_tenant_within_its_guarantee_regains_its_share_within_one_cycle(snapshot):
    first = decide(snapshot, now=1000.0)
    check_invariants(snapshot, first)
    assert {p.job_id for p in first.pending if p.reason.code != "reclaiming"} == set(), [
        (p.job_id, p.reason.message) for p in first.pending]
    _the_next_cycle_starts_each_job_on_its_promised_gpus(snapshot, first)


@settings(SETTINGS, max_examples=60)
@given(borrowed_clusters(pairs_first=False))
def test_jobs_that_reclaimed_start_on_the_gpus_freed_for_them_whatever_their_order(snapshot):
    """Without its promises, the second cycle forgot whom each freed GPU was for: found here at
    3,000 examples (nodes of 2 + 3 GPUs of one model and 3 of another, the owner's 1 + 2 + 2 GPUs
    in that order), a single took half of a pair's GPUs by best fit and the pair reclaimed again."""
    first = decide(snapshot, now=1000.0)
    assume(all(p.reason.code == "reclaiming" for p in first.pending))
    _the_next_cycle_starts_each_job_on_its_promised_gpus(snapshot, first)


def _the_next_cycle_starts_each_job_on_its_promised_gpus(snapshot, first) -> None:
    # The service evicts the victims, launches what was placed and keeps the promises; next cycle
    # the owner runs, on the GPUs freed for each job, and nobody else is preempted.
    after = dataclasses.replace(launch(snapshot, first, now=1001.0, draw=None), promises=first.promises)
    second = decide(after, now=1002.0)
    assert {p.job_id for p in second.placements} == {j.id for j in after.pending}
    assert second.preemptions == ()
    promised = {p.job_id: set(p.gpu_ids) for p in first.promises}
    assert all(set(p.gpu_ids) == promised[p.job_id] for p in second.placements if p.job_id in promised)
    assert all(str(p.job_class) == "guaranteed" for p in second.placements)
