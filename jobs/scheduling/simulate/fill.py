"""FGD's evaluation protocol (Weng et al., ATC'23, section 6.1) as a replay mode, faithful to its
simulator (``hkust-adsl/kubernetes-scheduler-simulator``; the file and function names below are
its).

Workload (``core.go: Simulate``, ``simulator.go: SortClusterPods``, ``TunePodsByNodeTotalResource``):
every pod of the list (CPU-only ones included) is shuffled with the seed; a list that asks for
less than ``until`` (130%) of the cluster's GPU capacity gets pods drawn at random from it
appended, one that asks for more is cut there. Pods then arrive one by one, nothing leaves.

Arrival (``simulator.go: SchedulePods``): FGD schedules each pod once, on arrival, and a pod that
fails is never retried; the x axis is the GPU requests of the pods arrived so far, the failed
ones included. Here pods arrive in batches of ``step`` of the capacity, and a cycle places the
batch; whatever the cycles leave pending is dropped (failed), never retried. For the baselines
(``Protocol``: one pod after another in arrival order, each placement seen by the next, a fixed
target workload, no retries) a batch is exactly one-by-one arrival: the batch only sets how often
the snapshot is rebuilt, and every pod's reading is rebuilt from the order of the placements.
Colony's own policies (``fair_share``, ``packing_without_quotas``) run through the same engine and
interface, ``cycles_per_step`` cycles per batch (a reclaim places on the next cycle), and order a
batch their own way (fair share across tenants, then each tenant's queue): that, and the pods of
one batch not seeing each other's arrival, is what remains of batching for them. A cycle per pod
would cost about the core's cycle times 10,000 pods.

CPU-only pods: a baseline places them with its own score, as FGD's plugins do. Colony's core never
sees CPU-only work (a job asks at least one GPU), so for its policies the fill places them, on
arrival, as the protocol has every scheduler do: by the policy's own score. That is Colony's
fragmentation gradient (``fragmentation_score``) against its own target workload, the GPU
requests running and queued (``gpu_requests``): the node whose ``F_n(M)`` the pod's CPU and host
memory raise least, i.e. where it strands the least GPU capacity; on a tie a node with no free GPU
share, then the one with the most CPU its free GPUs will not need at the workload's CPU per GPU
(``cpu_only="least_stranding"``, ``_cpu_only_node``). The rule it replaced (``"most_free_cpu"``:
a node with no free GPU share if one has room, else the one with the most free CPU) sent them to
the 128-CPU nodes that alone can feed an 8-GPU pod asking 120 CPUs. Seeds 0-2, % allocated at
100% arrived, before -> after: gpushare40 +1.33 / +0.58 / +1.04, default -0.24 / +0.11 / +0.16,
multigpu50 +0.06 / +0.01 / +0.11, and at 80 and 90% arrived no seed of any list lower
(``docs/scheduling-quality.md``). Taking the tightest CPU fit on a tie instead lost default 0.3
(median 94.2). FGD's own rule for them (its typical pods, least fragmentation raised, first node
on a tie) cost Colony 3 points at 100% arrived: FGD's GPU pods pack onto the same first nodes,
Colony's do not.

GPU memory: FGD's openb runs have none (a GPU holds 1000 milli of requests, whatever they need in
memory), so every pod here asks for its share of its GPU's memory and no more, for every policy.

Read per pod, as ``analysis.go: ClusterGpuFragReport`` logs after every pod:

* **allocated (physical)**: placed requests with each GPU capped at 1000 milli-GPUs, over the
  cluster's GPU capacity: FGD's "used GPU milli". At an arrived percentage L the figure is the
  mean over the pods whose arrived share rounds to L, as ``merge_alloc_discrete_0920.py`` reads
  it (``at``). An opportunistic whole-GPU job that joins an occupied GPU adds nothing here.
* **allocated (requests)**: placed requests uncapped, the figure earlier Colony replays printed.
* **fragmentation**: FGD's ``F(M)`` of the cluster against its typical pods
  (``fragmentation.Workload.typical``), as a share of GPU capacity and of the
  unallocated capacity, read at the end of the batch that reaches the level.
* **CPU over capacity**: nodes whose placed CPU requests exceed their CPU.

What still differs from FGD's runs. Its random generator (Go's ``math/rand``, seeds 42-51) is not
reproduced, only the same kinds of draws; so a seed here is not FGD's seed, and figures compare as
spreads over seeds. Ties between nodes follow its simulator's patched kube-scheduler as its
published curves imply (``binpack`` module docstring: the first tied node in node order), which
the source we can read does not show.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.fragmentation import WHOLE, Workload
from jobs.scheduling.simulate.engine import Replay
from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob, equal_quotas

LEVELS = (0.8, 0.9, 1.0, 1.3)

# FGD's published GPU allocation ratios at 100% arrived (10-seed means, CPU enforced), from the
# scheduling-quality issue: (BestFit, FGD) per pod list.
PUBLISHED_AT_100 = {
    "default": (0.929, 0.952), "gpushare40": (0.914, 0.940), "gpushare80": (0.867, 0.891),
    "gpushare100": (0.846, 0.866), "gpuspec33": (0.804, 0.878), "multigpu30": (0.946, 0.964),
}


@dataclass(frozen=True, slots=True)
class Reading:
    arrived: float  # requested GPU capacity arrived, share of the cluster
    physical: float  # allocated, each GPU capped at 1000 milli
    requested: float  # allocated requests, uncapped
    fragmentation: float | None = None  # F(M) as a share of GPU capacity (at LEVELS only)
    frag_of_unallocated: float | None = None
    cpu_over: int = 0  # nodes with more CPU requested than they have
    pending: int = 0


def arrivals(pods: list[TraceJob], capacity_milli: int, seed: int, until: float = 1.3) -> list[TraceJob]:
    """The pods shuffled by ``seed``, then resampled with replacement, until ``until`` x capacity
    has arrived (the list is cut there when it holds more)."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    asked = sum(p.gpus * p.gpu_milli for p in order)
    gpu_pods = [p for p in pods if p.gpus]
    while asked < until * capacity_milli and gpu_pods:
        order.append(rng.choice(pods))
        asked += order[-1].gpus * order[-1].gpu_milli
    # Up to the pod that takes the arrived share past ``until``.
    asked, end = 0, len(order)
    for i, p in enumerate(order):
        asked += p.gpus * p.gpu_milli
        if asked >= until * capacity_milli:
            end = i + 1
            break
    # Fresh ids in arrival order (a resampled pod is a new pod).
    return [replace(p, id=i + 1, submit_s=0.0) for i, p in enumerate(order[:end])]


CPU_ONLY_RULES = ("least_stranding", "most_free_cpu")


def gpu_requests(engine: Replay) -> Workload:
    """Colony's target workload as its core's score reads it (``fragmentation_score``): the GPU
    requests running and queued, one class per (GPUs, milli, models) at its median CPU and memory,
    a multi-GPU one per exact CPU too."""
    return Workload.of([run_.job for run_ in engine.running.values()] + list(engine.pending.values()),
                       gangs_by_cpu=True)


def cpu_per_gpu(workload: Workload) -> float:
    """CPU milli the workload's GPU requests ask per whole GPU they take (popularity-weighted)."""
    gpu_classes = [c for c in workload.classes if c.gpus]
    gpus = sum(c.popularity * c.gpus * c.milli / WHOLE for c in gpu_classes)
    return sum(c.popularity * c.cpu_milli for c in gpu_classes) / gpus if gpus else 0.0


def _cpu_only_node(engine: Replay, job: TraceJob, workload: Workload | None) -> int | None:
    """The node a CPU-only pod goes to for Colony's policies (module docstring). ``workload``:
    the least GPU capacity stranded against it, then the most CPU its free GPUs will not need;
    None: the most free CPU."""
    # ``F_n(M)`` asks whether one more task of each class fits: a node keeps feeding its GPUs only
    # while it holds their CPU, so among nodes it strands alike the pod takes spare CPU, past
    # what its free GPUs need at the workload's CPU per GPU.
    ratio = cpu_per_gpu(workload) if workload is not None else 0.0
    best = None
    for n, spec in enumerate(engine.trace.nodes):
        cpu, memory = engine.host_free(n)
        if (cpu is not None and cpu < job.cpu_milli) or (memory is not None and memory < job.host_memory_mb):
            continue
        cpu = float("inf") if cpu is None else cpu
        free = tuple(max(0, WHOLE - engine.gpus[g].milli) for g in engine.node_gpus[n])
        if workload is None:
            key = (any(free), -cpu, n)
        else:
            memory = float("inf") if memory is None else memory
            stranded = 0.0
            if any(free):
                stranded = (workload.node(spec.model, free, cpu - job.cpu_milli, memory - job.host_memory_mb)
                            - workload.node(spec.model, free, cpu, memory))
            key = (stranded, any(free), ratio * sum(free) / WHOLE - cpu, n)
        if best is None or key < best[0]:
            best = (key, n)
    return None if best is None else best[1]


def fragmentation(engine: Replay, workload: Workload) -> float:
    """F(M) of the cluster in milli-GPUs."""
    total = 0.0
    for n, spec in enumerate(engine.trace.nodes):
        cpu, memory = engine.host_free(n)
        free = tuple(max(0, WHOLE - engine.gpus[g].milli) for g in engine.node_gpus[n])
        total += workload.node(spec.model, free, float("inf") if cpu is None else cpu,
                               float("inf") if memory is None else memory)
    return total


def without_gpu_memory(job: TraceJob) -> TraceJob:
    """The pod as FGD's protocol sees it: its GPU memory is its share of the GPU's."""
    if job.memory_mib is None and job.seen_memory_mib is None:
        return job
    return replace(job, memory_mib=None, seen_memory_mib=None)


def run(pods: list[TraceJob], nodes: tuple[NodeSpec, ...], policy, *, seed: int, until: float = 1.3,
        step: float = 0.01, cycles_per_step: int = 3, config: SchedulerConfig = SchedulerConfig(),
        levels: tuple[float, ...] = LEVELS, cpu_only: str = "least_stranding") -> list[Reading]:
    """One reading per arrived pod (module docstring). A baseline (a policy with
    ``fgd_protocol``) runs as FGD's simulator runs it, seeded with ``seed``; any other policy
    runs as it is, its CPU-only pods placed by the rule ``cpu_only`` names (``CPU_ONLY_RULES``)."""
    if cpu_only not in CPU_ONLY_RULES:
        raise ValueError(f"cpu_only: one of {CPU_ONLY_RULES}")
    capacity = sum(n.gpus for n in nodes) * WHOLE
    jobs = [without_gpu_memory(job) for job in arrivals(pods, capacity, seed, until)]
    tenants = sorted({p.tenant for p in pods})
    trace = Trace("fill", tuple(jobs), nodes, equal_quotas(tenants, capacity // WHOLE), timed=False)
    workload = Workload.typical(pods)
    baseline = getattr(policy, "fgd_protocol", None) is not None
    engine: Replay | None = None
    if baseline:
        protocol = policy.fgd_protocol(workload, seed)

        def policy(snapshot, now, config_=None):
            # CPU-only pods come back as placements without GPUs: the engine runs them here.
            decisions = protocol(snapshot, now, config_)
            gpu_work = []
            for place in decisions.placements:
                if place.gpu_ids:
                    gpu_work.append(place)
                else:
                    engine.start_cpu_only(place.job_id, node_index[place.slices[0].node])
            return replace(decisions, placements=tuple(gpu_work))

        policy.__name__ = protocol.__name__
        cycles_per_step = 1  # it placed all it could; a second cycle would only retry failures
    engine = Replay(trace, policy, config)
    node_index = {spec.name: n for n, spec in enumerate(nodes)}
    readings: list[Reading] = []
    arrived, position, t = 0, 0, 0.0
    stranding: tuple[tuple, Workload] | None = None  # ((running, pending) counts, workload) for CPU-only pods
    next_level = 0
    while position < len(jobs):
        target = arrived + step * capacity
        batch: list[tuple[TraceJob, int]] = []
        while position < len(jobs) and arrived < target:
            job = jobs[position]
            position += 1
            arrived += job.gpus * job.gpu_milli
            batch.append((job, arrived))
            if job.gpus or baseline:
                engine.enqueue(job, t)
            else:
                against = None
                if cpu_only == "least_stranding":
                    # The requests as they stand at the pod's arrival (the batch's GPU pods so far queued).
                    counts = (len(engine.running), len(engine.pending))
                    if stranding is None or stranding[0] != counts:
                        stranding = (counts, gpu_requests(engine))
                    against = stranding[1]
                node = _cpu_only_node(engine, job, against)
                if node is not None:
                    engine.start_cpu_only(job.id, node)
        physical, allocated = engine.physical, engine.allocated
        preempted = False
        for _ in range(cycles_per_step):
            t += engine.interval
            engine.now = t
            before = engine.allocated
            decisions = engine.cycle(t)
            preempted = preempted or bool(decisions.preemptions)
            if not any(job.id in engine.pending for job, _ in batch):
                break
            if engine.allocated == before and not decisions.preemptions:
                break
        # FGD tries a pod once: what this batch's cycles left is failed, never retried.
        for job, _ in batch:
            if engine.pending.pop(job.id, None) is not None:
                engine.pending_since.pop(job.id, None)
        frag = frag_unallocated = None
        share = arrived / capacity
        if next_level < len(levels) and share >= levels[next_level] - 1e-9:
            while next_level < len(levels) and share >= levels[next_level] - 1e-9:
                next_level += 1
            f = fragmentation(engine, workload)
            frag = f / capacity
            unallocated = capacity - engine.physical
            frag_unallocated = f / unallocated if unallocated else 0.0
        cpu_over = _cpu_over(engine)
        steps = [(a, engine.physical, engine.allocated) for _, a in batch] if preempted else \
            _per_pod(engine, batch, physical, allocated)
        for i, (a, phys, alloc) in enumerate(steps):
            last = i == len(steps) - 1
            readings.append(Reading(a / capacity, phys / capacity, alloc / capacity, frag if last else None,
                                    frag_unallocated if last else None, cpu_over, 0))
    return readings


def _per_pod(engine: Replay, batch: list[tuple[TraceJob, int]], physical: int, allocated: int) -> list[tuple]:
    """(arrived, physical, allocated) after each pod of a batch, from the placements in arrival
    order: the engine's totals move by each placed pod's milli-GPUs, each GPU capped at 1000."""
    placed = [engine.running[job.id] for job, _ in batch if job.id in engine.running]
    milli: dict[int, int] = {}
    for run_ in placed:
        for g in run_.gpu_ids:
            milli[g] = milli.get(g, engine.gpus[g].milli) - run_.job.gpu_milli
    out = []
    for job, a in batch:
        run_ = engine.running.get(job.id)
        if run_ is not None:
            for g in run_.gpu_ids:
                old = milli[g]
                milli[g] = old + job.gpu_milli
                physical += min(WHOLE, milli[g]) - min(WHOLE, old)
                allocated += job.gpu_milli
        out.append((a, physical, allocated))
    return out


def _cpu_over(engine: Replay) -> int:
    return sum(1 for n in range(len(engine.trace.nodes)) if (engine.host_free(n)[0] or 0) < 0)


def at(readings: list[Reading], level: float) -> Reading | None:
    """The reading at ``level`` arrived as FGD's analysis reads it: the mean over the pods whose
    arrived percentage rounds to the level's (within one point when none does); fragmentation
    from the first reading past the level that measured it."""
    percent = round(level * 100)
    near = [r for r in readings if round(r.arrived * 100) == percent]
    if not near:
        near = [r for r in readings if abs(round(r.arrived * 100) - percent) <= 1]
    if not near:
        return None
    measured = next((r for r in readings if r.arrived >= level - 1e-9 and r.fragmentation is not None), None)
    return Reading(statistics.fmean(r.arrived for r in near), statistics.fmean(r.physical for r in near),
                   statistics.fmean(r.requested for r in near),
                   measured.fragmentation if measured else None, measured.frag_of_unallocated if measured else None,
                   max(r.cpu_over for r in near))


def summary(readings: list[Reading], levels: tuple[float, ...] = LEVELS) -> dict:
    out = {}
    for level in levels:
        r = at(readings, level)
        if r is not None:
            out[f"{round(level * 100)}"] = {
                "physical": r.physical, "requested": r.requested, "fragmentation": r.fragmentation,
                "frag_of_unallocated": r.frag_of_unallocated, "cpu_over_nodes": r.cpu_over}
    return out


def spread(values: list[float]) -> dict:
    """Median and range over seeds."""
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
