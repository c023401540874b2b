"""FGD's evaluation protocol (Weng et al., ATC'23, section 6.1) as a replay mode.

Every pod of a list (CPU-only and never-scheduled ones included) is shuffled with a seed; pods
then arrive in that order, drawn again at random from the list once it is spent, until the GPU
capacity they ask for reaches ``until`` (130%) of the cluster's. Nothing leaves. After each
``step`` of the capacity has arrived the policy runs (up to ``cycles_per_step`` cycles, as the
loop would); what it could not place stays pending (with nothing leaving, it never fits later).

Read at 80/90/100/130% arrived:

* **allocated (physical)**: placed requests with each GPU capped at 1000 milli-GPUs, over the
  cluster's GPU capacity: FGD's GPU allocation ratio. An opportunistic whole-GPU job that joins
  an occupied GPU adds nothing here.
* **allocated (requests)**: placed requests uncapped, the figure earlier Colony replays printed.
* **fragmentation**: FGD's ``F(M)`` of the cluster (``policies.fragmentation``, M the pod list's
  classes), as a share of GPU capacity and of the unallocated capacity.
* **CPU over capacity**: nodes whose placed CPU requests exceed their CPU.

CPU-only pods never reach the core (it places GPU work); every policy gets them placed by the
same rule, on arrival: on a node with no free GPU share if one has room, else the one with the
most free CPU, so they strand as little GPU capacity as the rule can see. FGD's own simulator
lets each policy score them; that is one difference from the published protocol.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.policies.fragmentation import WHOLE, Workload
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


def _cpu_only_node(engine: Replay, job: TraceJob) -> int | None:
    best = None
    for n in range(len(engine.trace.nodes)):
        cpu, memory = engine.host_free(n)
        if (cpu is not None and cpu < job.cpu_milli) or (memory is not None and memory < job.host_memory_mb):
            continue
        free_gpu = any(engine.gpus[g].milli < WHOLE for g in engine.node_gpus[n])
        key = (free_gpu, -(cpu if cpu is not None else float("inf")), n)
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


def run(pods: list[TraceJob], nodes: tuple[NodeSpec, ...], policy, *, seed: int, until: float = 1.3,
        step: float = 0.02, cycles_per_step: int = 3, config: SchedulerConfig = SchedulerConfig(),
        levels: tuple[float, ...] = LEVELS) -> list[Reading]:
    capacity = sum(n.gpus for n in nodes) * WHOLE
    jobs = arrivals(pods, capacity, seed, until)
    tenants = sorted({p.tenant for p in pods})
    trace = Trace("fill", tuple(jobs), nodes, equal_quotas(tenants, capacity // WHOLE), timed=False)
    engine = Replay(trace, policy, config)
    workload = Workload.of(pods)
    readings: list[Reading] = []
    arrived, position, t = 0, 0, 0.0
    next_level = 0
    while position < len(jobs):
        target = arrived + step * capacity
        while position < len(jobs) and arrived < target:
            job = jobs[position]
            position += 1
            arrived += job.gpus * job.gpu_milli
            if job.gpus:
                engine.enqueue(job, t)
            else:
                node = _cpu_only_node(engine, job)
                if node is not None:
                    engine.start_cpu_only(job.id, node)
        for _ in range(cycles_per_step):
            t += engine.interval
            engine.now = t
            before = engine.allocated
            decisions = engine.cycle(t)
            if engine.allocated == before and not decisions.preemptions:
                break
        share = arrived / capacity
        frag = frag_unallocated = None
        if next_level < len(levels) and share >= levels[next_level] - 1e-9:
            while next_level < len(levels) and share >= levels[next_level] - 1e-9:
                next_level += 1
            f = fragmentation(engine, workload)
            frag = f / capacity
            unallocated = capacity - engine.physical
            frag_unallocated = f / unallocated if unallocated else 0.0
        readings.append(Reading(share, engine.physical / capacity, engine.allocated / capacity, frag, frag_unallocated,
                                _cpu_over(engine), len(engine.pending)))
    return readings


def _cpu_over(engine: Replay) -> int:
    return sum(1 for n in range(len(engine.trace.nodes)) if (engine.host_free(n)[0] or 0) < 0)


def at(readings: list[Reading], level: float) -> Reading | None:
    """The first reading at or past ``level`` arrived."""
    return next((r for r in readings if r.arrived >= level - 1e-9), None)


def summary(readings: list[Reading], levels: tuple[float, ...] = LEVELS) -> dict:
    out = {}
    for level in levels:
        r = at(readings, level)
        if r is not None:
            out[f"{round(level * 100)}"] = {"physical": r.physical, "requested": r.requested,
                                            "fragmentation": r.fragmentation, "frag_of_unallocated": r.frag_of_unallocated,
                                            "cpu_over_nodes": r.cpu_over}
    return out


def spread(values: list[float]) -> dict:
    """Median and range over seeds."""
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
