"""Figures from a replay: what operators compare when they choose a scheduler.

* Job completion time (submit -> finish) and queueing delay (time spent pending, requeues
  included): mean, median, p95.
* GPU-time utilisation: busy SM time over capacity x makespan (a GPU's load counts up to 1;
  it rests on the per-job utilisation, synthetic for the public traces); GPU allocation: GPU-time
  with at least one job on the GPU; physical allocation: requests placed with each GPU capped at
  1000 milli-GPUs (FGD's allocation ratio; never above 1); memory utilisation likewise. Each
  over the whole run and over the arrival window (first to last submission), where the trace
  sets the load rather than the tail of its longest jobs.
* Guaranteed jobs' slowdown: for the jobs that ran guaranteed only, the mean of their running
  time (JCT less queueing) over their solo runtime, less one: what sharing a GPU with borrowers
  cost the jobs that were promised theirs (AntMan's bar: about none).
* Per tenant: GPU-hours held, the entitlement its guarantee gives over the makespan, and the
  mean slowdown of its jobs (JCT over solo runtime). Jain's fairness index is taken over the
  tenants' mean speed (solo runtime over JCT): 1 when every tenant's jobs fare alike.
* Fragmentation ("Beware of Fragmentation", ATC'23): ``fill_curve`` lets jobs arrive and never
  leave, and records what share of the cluster's GPU capacity is allocated (physical, capped per
  GPU) as the arrived demand grows; a packing policy that strands less capacity stays on the
  diagonal longer. ``simulate.fill`` is FGD's full protocol (all pods, seeds, F(M)).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from dataclasses import dataclass, replace

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.simulate.engine import JobRecord, Replay, ReplayResult
from jobs.scheduling.simulate.trace import Trace
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def jain_index(values: list[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 for equal shares, 1/n when one party gets everything."""
    values = [v for v in values if v is not None]
    if not values:
        return 1.0
    squares = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * squares) if squares else 1.0


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p95": None}
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "p95": percentile(values, 95)}


def _guaranteed_slowdown(finished: list[JobRecord]) -> float | None:
    stretch = [(r.jct - r.queued_s) / r.job.duration_s - 1 for r in finished
               if r.guaranteed_gpu_s > 0 and not r.opportunistic_gpu_s and r.job.duration_s > 0]
    return statistics.fmean(stretch) if stretch else None


def summarise(result: ReplayResult) -> dict:
    trace = result.trace
    records = [r for r in result.records.values()]
    finished = [r for r in records if r.finish is not None]
    makespan = max(result.end - result.start, 1e-9)
    capacity_gpu_s = trace.total_gpus * makespan
    capacity_memory = sum(n.gpus * n.memory_mib for n in trace.nodes) * makespan
    quotas = {q.name: q for q in trace.quotas}
    tenants = {}
    for tenant in trace.tenants:
        mine = [r for r in finished if r.job.tenant == tenant]
        speed = [r.job.duration_s / r.jct for r in mine if r.jct and r.jct > 0]
        guarantee = quotas[tenant].guaranteed_gpus if tenant in quotas else 0
        tenants[tenant] = {
            "jobs": sum(1 for r in records if r.job.tenant == tenant),
            "gpu_hours": result.tenant_gpu_s.get(tenant, 0.0) / 3600,
            "entitlement_gpu_hours": guarantee * makespan / 3600,
            "demand_gpu_hours": sum(r.job.gpu_seconds for r in records if r.job.tenant == tenant) / 3600,
            "guaranteed_gpu_hours": sum(r.guaranteed_gpu_s for r in mine) / 3600,
            "opportunistic_gpu_hours": sum(r.opportunistic_gpu_s for r in mine) / 3600,
            "mean_slowdown": statistics.fmean(1 / s for s in speed) if speed else None,
            "mean_speed": statistics.fmean(speed) if speed else None,
        }
    return {
        "policy": result.policy,
        "trace": trace.name,
        "jobs": len(records),
        "finished": len(finished),
        "unfinished": len(result.unfinished),
        "gpus": trace.total_gpus,
        "jct_s": _spread([r.jct for r in finished]),
        "queueing_s": _spread([r.queued_s for r in finished]),
        "makespan_s": makespan,
        "gpu_utilisation": result.used_gpu_s / capacity_gpu_s,
        "gpu_allocation": result.busy_gpu_s / capacity_gpu_s,
        "gpu_physical_allocation": result.physical_gpu_s / capacity_gpu_s,
        "gpu_memory_utilisation": result.memory_mib_s / capacity_memory if capacity_memory else 0.0,
        **_arrival_window(result),
        "preemptions": result.preemptions,
        "throttles": result.throttles,
        "suspensions": result.suspensions,
        "cycles": result.cycles,
        "memory_violations": result.memory_violations,
        "cpu_violations": result.cpu_violations,
        "host_memory_violations": result.host_memory_violations,
        "interference": result.interference,
        "guaranteed_slowdown": _guaranteed_slowdown(finished),
        "jain_fairness": jain_index([t["mean_speed"] for t in tenants.values() if t["mean_speed"] is not None]),
        "tenants": tenants,
    }


def _arrival_window(result: ReplayResult) -> dict:
    """Utilisation between the first and the last arrival (None when they coincide)."""
    span = (result.arrivals_end or result.start) - result.start
    if span <= 0:
        return {"window_s": 0.0, "window_gpu_utilisation": None, "window_gpu_allocation": None,
                "window_gpu_physical_allocation": None, "window_gpu_memory_utilisation": None}
    nodes = result.trace.nodes
    return {
        "window_s": span,
        "window_gpu_utilisation": result.window_used_gpu_s / (result.trace.total_gpus * span),
        "window_gpu_allocation": result.window_busy_gpu_s / (result.trace.total_gpus * span),
        "window_gpu_physical_allocation": result.window_physical_gpu_s / (result.trace.total_gpus * span),
        "window_gpu_memory_utilisation":
            result.window_memory_mib_s / (sum(n.gpus * n.memory_mib for n in nodes) * span),
    }


def utilisation_series(result: ReplayResult, points: int = 200) -> list[tuple[float, float, float]]:
    """(hours since start, GPU utilisation, GPU allocation), time-averaged over ``points`` bins."""
    samples = result.samples
    if not samples or result.end <= result.start:
        return []
    width = (result.end - result.start) / points
    edges = [result.start + i * width for i in range(points)] + [result.end]
    gpus = result.trace.total_gpus
    bins_used, bins_busy = [0.0] * points, [0.0] * points
    for sample, following in zip(samples, samples[1:] + samples[-1:]):
        begin, end = sample.t, max(following.t, sample.t)
        index = min(points - 1, max(0, bisect_right(edges, begin) - 1))
        while begin < end and index < points:
            stop = min(end, edges[index + 1])
            if stop > begin:
                bins_used[index] += sample.utilisation * (stop - begin)
                bins_busy[index] += sample.busy_gpus * (stop - begin)
                begin = stop
            index += 1
    return [((i + 0.5) * width / 3600, bins_used[i] / (width * gpus), bins_busy[i] / (width * gpus))
            for i in range(points)]


@dataclass(frozen=True, slots=True)
class FillPoint:
    arrived: float  # requested GPU capacity that has arrived, as a share of the cluster
    allocated: float  # placed, each GPU capped at 1000 milli-GPUs, as a share of the cluster
    requested: float = 0.0  # placed requests uncapped (a GPU counted once per resident)


def fill_curve(trace: Trace, policy, config: SchedulerConfig = SchedulerConfig(), *, step: float = 0.02,
               until: float = 1.3, cycles_per_step: int = 3) -> list[FillPoint]:
    """Jobs arrive in trace order and never leave; after each ``step`` of the cluster's capacity
    has arrived, the policy runs (a few cycles, as the loop would) and the placed share is read.

    A trace that asks for less than ``until`` of the cluster is replayed again from its start (as
    new jobs), as Weng et al. sample their trace until the cluster is full."""
    if not trace.jobs:
        return []
    engine = Replay(trace, policy, config)
    capacity = trace.total_gpus * WHOLE_GPU_MILLI
    arrived, points, t = 0, [], 0.0
    jobs = sorted(trace.jobs, key=lambda j: (j.submit_s, j.id))
    next_id = max(j.id for j in jobs) + 1
    position = 0
    while arrived < until * capacity:
        target = arrived + step * capacity
        while arrived < target:
            job = jobs[position % len(jobs)]
            if position >= len(jobs):  # a second pass: the same request as a new job
                job = replace(job, id=next_id)
                engine.records[next_id] = JobRecord(job)
                next_id += 1
            engine.enqueue(job, t)
            arrived += job.gpus * job.gpu_milli
            position += 1
        for _ in range(cycles_per_step):
            t += engine.interval
            engine.now = t
            before = engine.allocated
            decisions = engine.cycle(t)
            if engine.allocated == before and not decisions.preemptions:
                break
        points.append(FillPoint(arrived / capacity, engine.physical / capacity, engine.allocated / capacity))
    return points


def fill_summary(points: list[FillPoint]) -> dict:
    """Allocated share when 80/90/100% of capacity has been requested, and the most reached."""
    def at(level: float) -> float | None:
        reached = [p.allocated for p in points if p.arrived >= level]
        return reached[0] if reached else None

    return {"allocated_at_80": at(0.8), "allocated_at_90": at(0.9), "allocated_at_100": at(1.0),
            "allocated_max": max((p.allocated for p in points), default=0.0)}
