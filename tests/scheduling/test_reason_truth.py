"""Every pending reason the core emits is true of the snapshot it decided on (hypothesis).

For each ``Pending`` the obstacle its reason names is recomputed here from the snapshot and the
cycle's own placements, independently of the core's indexes: a tenant said to be at its ceiling
really is, a node named as able to run the job really has a GPU of the job's model and memory,
"only cordoned nodes" means the job fits on no uncordoned node, "waiting for N free GPUs" means no
node has that many free GPUs that fit. A job whose need alone exceeds its tenant's ceiling is told
exactly that, never that it starts when the tenant's other jobs finish. A job with an image fits
only nodes with a container runtime; "no node runs containers" means none can take it; a job
waiting for its dependencies has some; an array at its cap really runs that many; a gang waiting
for one node could be held by one node and is still within its wait.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st


from jobs.scheduling import ClusterSnapshot, GpuState, JobClass, NodeState, ReasonCode, SchedulerConfig, decide
from jobs.scheduling.reservation import may_backfill
from jobs.scheduling.usage import charged_milli, weighted_share
from jobs.scheduling.waiting import LEVEL_USAGE_MARGIN
from tests.scheduling.builders import cluster, job, node, running, tenant

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MEMORY_GIB = {"A100": 80, "V100": 32, "T4": 16}
TENANTS = ("t0", "t1", "t2")
ONE_NODE_WAIT = SchedulerConfig().gang_single_node_wait_s


@st.composite
def snapshots(draw) -> ClusterSnapshot:
    node_states = []
    for i in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(sorted(MEMORY_GIB)))
        state = draw(st.sampled_from(["ok", "ok", "ok", "cordoned", "offline", "busy", "mixed"]))
        if state == "mixed":  # one node with two models (the core keeps such nodes apart)
            other = draw(st.sampled_from(sorted(set(MEMORY_GIB) - {model})))
            a = node(f"n{i}", gpus=2, model=model, mem_gib=MEMORY_GIB[model])
            b = node("x", gpus=2, model=other, mem_gib=MEMORY_GIB[other])
            gpus = (*a.gpus, *(GpuState(g.id, g.index + 2, g.model, g.memory_mib) for g in b.gpus))
            node_states.append(NodeState(f"n{i}", gpus, rack=f"r{i % 2}", runtimes=draw(runtimes())))
            continue
        node_states.append(node(f"n{i}", gpus=draw(st.integers(1, 4)), model=model, mem_gib=MEMORY_GIB[model],
                                rack=f"r{i % 2}", cordoned=state == "cordoned", online=state != "offline",
                                busy=1 if state == "busy" else 0, runtimes=draw(runtimes())))
    tenants = []
    for name in TENANTS[: draw(st.integers(1, 3))]:
        guaranteed = draw(st.integers(0, 6))
        tenants.append(tenant(name, guaranteed=guaranteed, max_gpus=guaranteed + draw(st.integers(0, 8)),
                              usage=draw(st.sampled_from([0.0, 3600.0, 36000.0]))))
    names = [t.name for t in tenants]
    specs, next_id = [], 100
    for n in node_states:
        if not n.online:
            continue
        free = [g.index for g in n.gpus if not g.busy]
        while free and draw(st.booleans()):
            take = free[: draw(st.integers(1, len(free)))]
            free = free[len(take):]
            specs.append(running(next_id, on=n.name, gpus=take, tenant=draw(st.sampled_from(names)),
                                 opportunistic=draw(st.booleans()), started_at=-100.0,
                                 runtime=draw(st.sampled_from([None, 60.0, 600.0])),
                                 preempting=draw(st.booleans()) and draw(st.booleans()),
                                 array=draw(st.sampled_from([None, None, 7]))))
            next_id += 1
    pending = []
    for i in range(1, draw(st.integers(1, 6)) + 1):
        gpus = draw(st.one_of(st.integers(1, 4), st.integers(1, 10)))
        fraction = gpus == 1 and draw(st.booleans()) and draw(st.booleans())
        pending.append(job(
            i, tenant=draw(st.sampled_from(names + ["unknown"])) if draw(st.booleans()) else names[0], gpus=gpus,
            milli=500 if fraction else 1000,
            models=tuple(draw(st.sets(st.sampled_from([*MEMORY_GIB, "H100"]), max_size=2))),
            mem_gib=draw(st.sampled_from([None, None, 10, 20, 40, 90])),
            max_nodes=draw(st.sampled_from([None, None, 1, 2])),
            opportunistic_only=draw(st.booleans()) and draw(st.booleans()),
            runtime=draw(st.sampled_from([None, None, 30.0])),
            reserved_since=draw(st.sampled_from([None, None, -100.0, -1000.0])),
            image=draw(st.booleans()) and draw(st.booleans()),
            waiting_for=draw(st.sampled_from([(), (), (), ((41, "ok"),), ((41, "any"), (42, "ok"))])),
            array=draw(st.sampled_from([None, None, (7, 1), (7, 2)]))))
    return cluster(*node_states, tenants=tenants, running=specs, pending=pending)


def runtimes():
    return st.sampled_from([(), (), ("docker",)])


@st.composite
def cycles(draw) -> tuple[ClusterSnapshot, float]:
    """A snapshot and the cycle's ``now``: gangs (submitted at t = their id) are within their wait
    for one node at t=0 and past it at the later times."""
    return draw(snapshots()), draw(st.sampled_from([0.0, 0.0, ONE_NODE_WAIT + 10, 5000.0]))


class World:
    """The snapshot after the cycle's own placements, as a reason's reader would check it."""

    def __init__(self, snapshot: ClusterSnapshot, decisions, now: float = 0.0):
        self.snapshot, self.decisions, self.now = snapshot, decisions, now
        self.runtime_gpus = {g.id for n in snapshot.nodes if n.runtimes for g in n.gpus}
        self.array_start = defaultdict(int)
        for r in snapshot.running:
            if r.array_id is not None:
                self.array_start[r.array_id] += 1
        self.array_end = dict(self.array_start)
        for place in decisions.placements:
            array = next(j for j in snapshot.pending if j.id == place.job_id).array_id
            if array is not None:
                self.array_end[array] = self.array_end.get(array, 0) + 1
        self.quotas = {t.name: t for t in snapshot.tenants}
        self.jobs = {j.id: j for j in snapshot.pending}
        self.held = defaultdict(int)
        self.guaranteed_held = defaultdict(int)
        occupied = set()
        requested = defaultdict(int)  # per GPU, what its residents ask
        for r in snapshot.running:
            for gpu_id in r.gpu_ids:
                requested[gpu_id] += r.gpu_milli
        for r in snapshot.running:
            # (a borrower on an over-committed GPU counts its share: ``usage.charged_milli``)
            self.held[r.tenant] += charged_milli(r.gpu_milli, [requested[g] for g in r.gpu_ids],
                                                 r.job_class is JobClass.OPPORTUNISTIC)
            if r.job_class is JobClass.GUARANTEED:
                self.guaranteed_held[r.tenant] += r.quota_milli
            occupied.update(r.gpu_ids)
        self.start_held, self.start_occupied = dict(self.held), set(occupied)
        for place in decisions.placements:
            request = self.jobs[place.job_id]
            self.held[request.tenant] += request.quota_milli
            if place.job_class is JobClass.GUARANTEED:
                self.guaranteed_held[request.tenant] += request.quota_milli
            occupied.update(place.gpu_ids)
        # A reclaiming job has been admitted: its GPUs count as the tenant's, and as guaranteed ones
        # unless it reclaims as a borrower (turnover).
        for waiting in decisions.pending:
            if waiting.reason.code is ReasonCode.RECLAIMING:
                request = self.jobs[waiting.job_id]
                self.held[request.tenant] += request.quota_milli
                if not waiting.reason.details.get("borrowed"):
                    self.guaranteed_held[request.tenant] += request.quota_milli
        # (GPUs reclaimed for a job are still held by their victims; free ones promised to it are not free)
        for promise in decisions.promises:
            occupied.update(promise.gpu_ids)
        self.occupied = occupied
        self.reserved = {name: r for r in decisions.reservations for name in r.nodes}

    def ceiling(self, tenant_name: str) -> int:
        quota = self.quotas.get(tenant_name)
        return 10**12 if quota is None else quota.ceiling_milli

    def fits(self, request, gpu, runtime: bool = True) -> bool:
        """``runtime=False``: as if the job had no image (what the inventory reasons speak of)."""
        memory = request.gpu_memory_mib
        return ((not request.gpu_models or gpu.model in request.gpu_models) and (memory or 0) <= gpu.memory_mib
                and (not (runtime and request.needs_runtime) or gpu.id in self.runtime_gpus))

    def fitting(self, request, schedulable=True, cordoned=False, model=None, runtime=True) -> dict[str, int]:
        """Fitting GPUs per node (present, whatever their load) on the chosen kind of node; of one
        model when ``model`` is given."""
        counts = {}
        for n in self.snapshot.nodes:
            if (schedulable and n.schedulable) or (cordoned and n.online and n.cordoned):
                counts[n.name] = sum(1 for g in n.gpus if self.fits(request, g, runtime) and model in (None, g.model))
        return counts

    def fitting_by_model(self, request, runtime=True, **kinds) -> dict[str, dict[str, int]]:
        """A gang runs on one GPU model: per model, its fitting GPUs per node."""
        models = {g.model for n in self.snapshot.nodes for g in n.gpus if self.fits(request, g, runtime)}
        return {model: self.fitting(request, model=model, runtime=runtime, **kinds) for model in models}

    def free_by_model(self, request, at_start: bool = False) -> dict[str, dict[str, int]]:
        models = {g.model for n in self.snapshot.nodes for g in n.gpus if self.fits(request, g)}
        return {model: self.free(request, at_start, model=model) for model in models}

    def free(self, request, at_start: bool = False, model=None) -> dict[str, int]:
        """Free fitting GPUs per schedulable node the job may use (held nodes only for backfill), after
        the cycle's placements or, ``at_start``, before them."""
        occupied = self.start_occupied if at_start else self.occupied
        counts = {}
        for n in self.snapshot.nodes:
            if not n.schedulable:
                continue
            holder = None if at_start else self.reserved.get(n.name)  # (a hold may be taken after the job's turn)
            if holder is not None and holder.job_id != request.id and not may_backfill(request, holder.eta_s):
                continue
            counts[n.name] = sum(1 for g in n.gpus if self.fits(request, g) and not g.busy and g.id not in occupied
                                 and model in (None, g.model))
        return counts

    def borrowers(self, at_start: bool = False) -> set[str]:
        """Tenants holding borrowed GPUs: opportunistic jobs still running (and those placed this cycle)."""
        running = {r.tenant for r in self.snapshot.running
                   if r.job_class is JobClass.OPPORTUNISTIC and not r.preempting}
        if at_start:
            return running
        return running | {self.jobs[p.job_id].tenant for p in self.decisions.placements
                          if p.job_class is JobClass.OPPORTUNISTIC}

    def borrowing_order(self, tenant: str) -> tuple[float, str]:
        """Lowest first: weighted usage before this cycle's placements, then the name."""
        quota = self.quotas.get(tenant)
        usage, weight = (quota.decayed_usage, quota.weight) if quota else (0.0, 1.0)
        return weighted_share(usage, self.start_held.get(tenant, 0), weight,
                              SchedulerConfig().usage_half_life_s), tenant

    def node(self, name: str) -> NodeState:
        return next(n for n in self.snapshot.nodes if n.name == name)

    def can_run_on(self, request, name: str) -> bool:
        return any(self.fits(request, g) for g in self.node(name).gpus)


def fits_any_model(request, by_model: dict[str, dict[str, int]]) -> bool:
    return any(fits_counts(request, per_node) for per_node in by_model.values())


def most_of_one_model(by_model: dict[str, dict[str, int]], combine=max) -> int:
    return max((combine(per_node.values(), default=0) if combine is max else combine(per_node.values())
                for per_node in by_model.values()), default=0)


def fits_counts(request, per_node: dict[str, int]) -> bool:
    widths = sorted(per_node.values(), reverse=True)
    if request.max_nodes is not None:
        widths = widths[: request.max_nodes]
    return sum(widths) >= request.gpus and (request.gpus == 1 or widths != [])


def check(world: World, pending) -> None:
    request, reason = world.jobs[pending.job_id], pending.reason
    code, details, message = reason.code, reason.details, reason.message
    need = request.quota_milli
    ceiling = world.ceiling(request.tenant)
    if need > ceiling:  # nothing else matters, and it must not sound temporary
        assert code is ReasonCode.OVER_MAX_GPUS, (code, message)
    if code is ReasonCode.OVER_MAX_GPUS:
        assert need > ceiling
        assert details["max_gpus"] * 1000 == ceiling and details["needed_gpus"] * 1000 == need
        assert "finish" not in message
    elif code is ReasonCode.AT_MAX_GPUS:
        # (what the tenant held when the job's turn came; placements later in the cycle add to it)
        assert need <= ceiling < world.held[request.tenant] + need, (world.held[request.tenant], need, ceiling)
        assert details["max_gpus"] * 1000 == ceiling and details["needed_gpus"] * 1000 == need
    elif code is ReasonCode.NO_NODES_ONLINE:
        assert not any(n.schedulable for n in world.snapshot.nodes)
    elif code is ReasonCode.GPU_MODEL_UNAVAILABLE:
        models = {g.model for n in world.snapshot.nodes if n.schedulable for g in n.gpus}
        assert request.gpu_models and not request.gpu_models & models
    elif code is ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY:
        assert not any(world.fitting(request).values())
        assert details["needed_mib"] == request.gpu_memory_mib
        largest = max(g.memory_mib for n in world.snapshot.nodes if n.schedulable for g in n.gpus
                      if not request.gpu_models or g.model in request.gpu_models)
        assert details["largest_mib"] == largest
    elif code is ReasonCode.GANG_LARGER_THAN_CLUSTER:
        by_model = world.fitting_by_model(request, runtime=False)
        assert details["cluster_gpus"] == most_of_one_model(by_model, sum) < request.gpus
    elif code is ReasonCode.GANG_LARGER_THAN_ANY_NODE:
        by_model = world.fitting_by_model(request, runtime=False)
        assert details["largest_node_gpus"] == most_of_one_model(by_model)
        assert not fits_any_model(request, by_model)
    elif code is ReasonCode.NEEDS_CORDONED_NODES:
        assert not fits_any_model(request, world.fitting_by_model(request)), "fits on an uncordoned node"
        assert fits_any_model(request, world.fitting_by_model(request, cordoned=True))
        for name in details["cordoned"]:
            assert world.node(name).cordoned and world.node(name).online
            assert world.can_run_on(request, name), f"{name} has no GPU this job can use"
    elif code is ReasonCode.WAITING_FOR_FREE_GPUS:
        # True when the job's turn came: between what was free before the cycle and after it.
        free, most_free = world.free_by_model(request), details["most_free_on_a_node"]
        assert most_of_one_model(free) <= most_free <= most_of_one_model(world.free_by_model(request, True))
        if request.gpus == 1 or request.max_nodes == 1:
            assert most_free < request.gpus
        else:
            assert not fits_any_model(request, free)
    elif code is ReasonCode.RESERVED_FOR_GANG:
        holder = next(r for r in world.decisions.reservations if r.job_id == details["holder_job"])
        assert tuple(details["nodes"]) == holder.nodes
        assert any(world.can_run_on(request, name) for name in holder.nodes)
    elif code is ReasonCode.HOLDING_RESERVATION:
        mine = next(r for r in world.decisions.reservations if r.job_id == request.id)
        assert tuple(details["nodes"]) == mine.nodes
        for name in mine.nodes:
            assert world.can_run_on(request, name), f"{name} has no GPU this job can use"
    elif code is ReasonCode.RECLAIMING:
        victims = [p for p in world.decisions.preemptions if p.for_job_id == request.id]
        assert details["victims"] == len(victims)
    elif code is ReasonCode.OVER_QUOTA_CLUSTER_FULL:
        # (a tenant that starts borrowing later in the cycle may be ahead of it by the end; one level
        # with it, within LEVEL_USAGE_MARGIN above, takes turns with it)
        level = world.borrowing_order(request.tenant)[0] * (1 + LEVEL_USAGE_MARGIN)
        assert not any(world.borrowing_order(t)[0] <= level
                       for t in world.borrowers(at_start=True) - {request.tenant}), "should say who is ahead"
        quota = world.quotas.get(request.tenant)
        guaranteed = 0 if quota is None else quota.guaranteed_milli
        unused = guaranteed - world.guaranteed_held[request.tenant]
        assert details["unused_guaranteed_gpus"] * 1000 == unused
        assert request.opportunistic_only or unused < need
    elif code is ReasonCode.NEEDS_CONTAINER_RUNTIME:
        assert request.needs_runtime
        assert details["runtime_nodes"] == sorted(n.name for n in world.snapshot.nodes if n.schedulable and n.runtimes)
        assert fits_any_model(request, world.fitting_by_model(request, runtime=False)), "impossible anyway: say why"
        assert not fits_any_model(request, world.fitting_by_model(request)), "fits on a node with a runtime"
    elif code is ReasonCode.WAITING_FOR_DEPENDENCY:
        assert request.waiting_for
        assert [(w["job"], w["kind"]) for w in details["waiting_for"]] == list(request.waiting_for)
    elif code is ReasonCode.ARRAY_LIMIT:
        assert request.array_id == details["array_id"] and request.array_limit == details["max_running"]
        assert world.array_start[request.array_id] <= details["running"] <= world.array_end[request.array_id]
        assert details["running"] >= request.array_limit
    elif code is ReasonCode.WAITING_FOR_ONE_NODE:
        assert request.gpus > 1 and request.max_nodes != 1
        assert world.now - request.submitted_at < ONE_NODE_WAIT
        by_model = world.fitting_by_model(request)
        assert any(max(per_node.values(), default=0) >= request.gpus for per_node in by_model.values())
        assert most_of_one_model(world.free_by_model(request)) < request.gpus, "a node has room now"
        assert details["spread_nodes"] > 1
    elif code is ReasonCode.BEHIND_LOWER_USAGE_TENANTS:
        level = world.borrowing_order(request.tenant)[0] * (1 + LEVEL_USAGE_MARGIN)
        ahead = {t for t in world.borrowers() - {request.tenant} if world.borrowing_order(t)[0] <= level}
        assert ahead, "no tenant ahead of it in the borrowing order holds borrowed GPUs"
        assert details["tenant"] == request.tenant


@SETTINGS
@given(cycles())
def test_every_pending_reason_names_an_obstacle_that_exists(cycle):
    snapshot, now = cycle
    decisions = decide(snapshot, now=now)
    world = World(snapshot, decisions, now)
    for pending in decisions.pending:
        event(str(pending.reason.code))
        check(world, pending)
    by_id = {j.id: j for j in snapshot.pending}
    for place in decisions.placements:
        request = by_id[place.job_id]
        assert not request.waiting_for, "placed before its dependencies ended"
        assert place.note
        if request.needs_runtime:
            assert all(g in world.runtime_gpus for g in place.gpu_ids), "an image job on a node without a runtime"
    for array, count in world.array_end.items():
        limits = {j.array_limit for j in snapshot.pending if j.array_id == array and j.array_limit is not None}
        placed_here = sum(1 for p in decisions.placements if by_id[p.job_id].array_id == array)
        if limits and placed_here:
            assert count <= max(limits), f"array {array} runs {count}"


def test_a_job_over_its_tenants_ceiling_says_so_not_that_it_waits():
    snapshot = cluster(node("a", gpus=8), node("b", gpus=8), node("c", gpus=8),
                       tenants=[tenant("vision", guaranteed=8, max_gpus=16)],
                       pending=[job(1, tenant="vision", gpus=17)])
    (pending,) = decide(snapshot, now=0).pending
    assert pending.reason.code is ReasonCode.OVER_MAX_GPUS
    assert "finish" not in pending.reason.message
    assert "17" in pending.reason.message and "16-GPU ceiling" in pending.reason.message
    assert "operator" in pending.reason.message


def test_a_job_over_its_ceiling_with_cordoned_nodes_is_told_the_ceiling():
    snapshot = cluster(node("a", gpus=8, cordoned=True), node("b", gpus=8), node("c", gpus=8),
                       tenants=[tenant("vision", guaranteed=8, max_gpus=16)],
                       pending=[job(1, tenant="vision", gpus=17)])
    (pending,) = decide(snapshot, now=0).pending
    assert pending.reason.code is ReasonCode.OVER_MAX_GPUS


def test_only_cordoned_nodes_with_the_jobs_model_are_named():
    snapshot = cluster(node("node-1", model="A100", cordoned=True),
                       node("node-2", model="V100", mem_gib=32, cordoned=True),
                       node("node-3", model="A100"), pending=[job(1, models=("V100",))])
    (pending,) = decide(snapshot, now=0).pending
    assert pending.reason.code is ReasonCode.NEEDS_CORDONED_NODES
    assert pending.reason.details["cordoned"] == ["node-2"]
    assert "node-1" not in pending.reason.message


def test_a_free_gpu_promised_to_a_reclaiming_job_is_not_offered_to_the_next():
    """Found by the property above: the free GPU beside a reclaimed one is the reclaiming gang's."""
    snapshot = cluster(node("n0", gpus=2),
                       tenants=[tenant("t0", guaranteed=3, max_gpus=3), tenant("t1", guaranteed=0, max_gpus=0)],
                       running=[running(100, on="n0", gpus=[0], tenant="t1", opportunistic=True)],
                       pending=[job(1, tenant="t0", gpus=2), job(2, tenant="t0", gpus=1)])
    decisions = decide(snapshot, now=0)
    reasons = {p.job_id: p.reason for p in decisions.pending}
    assert reasons[1].code is ReasonCode.RECLAIMING and reasons[1].details["victims"] == 1
    assert reasons[2].code is ReasonCode.WAITING_FOR_FREE_GPUS
    assert reasons[2].details["most_free_on_a_node"] == 0
    (promise,) = decisions.promises
    assert len(promise.gpu_ids) == 2  # both of n0's GPUs, the free one included
    for pending in decisions.pending:
        check(World(snapshot, decisions), pending)


def test_a_borrower_waiting_on_gpus_already_stopping_is_told_so_not_zero_victims():
    snapshot = cluster(node("n0", gpus=1), node("n1", gpus=2),
                       tenants=[tenant("t0", guaranteed=0, max_gpus=4), tenant("t1", guaranteed=0, max_gpus=0)],
                       running=[running(100, on="n0", gpus=[0], tenant="t0", opportunistic=True, preempting=True),
                                running(101, on="n1", gpus=[0], tenant="t1")],
                       pending=[job(1, tenant="t0", gpus=2), job(2, tenant="t0", gpus=1)])
    decisions = decide(snapshot, now=0)
    reasons = {p.job_id: p.reason for p in decisions.pending}
    assert reasons[1].code is ReasonCode.RECLAIMING and reasons[1].details["borrowed"]
    assert "preempting 0" not in reasons[1].message
    assert "promised to it" in reasons[1].message and "n0, n1" in reasons[1].message
    assert reasons[2].code is ReasonCode.OVER_QUOTA_CLUSTER_FULL
    assert reasons[2].details["unused_guaranteed_gpus"] == 0
    for pending in decisions.pending:
        check(World(snapshot, decisions), pending)
