"""Readers for the public traces in ``shared/traces`` (see its README), producing a ``Trace``.

* **Philly** (Microsoft, 2017; the Pollux artifact's condensed CSV): submit time, duration, GPUs,
  virtual cluster. The virtual cluster is the tenant. The trace has no per-job utilisation or
  memory, so each job draws them from ``synthetic_usage`` (seeded, reproducible).
* **Alibaba PAI 2023** ("openb", Weng et al., ATC'23): nodes with their GPU models, pods with
  ``num_gpu``, fractional ``gpu_milli``, ``gpu_spec`` model constraints and ``qos``. BE pods run
  opportunistic only; LS, Guaranteed and Burstable pods run guaranteed within their tenant's quota.
  The trace names no user or team, so pods are spread over ``tenants`` synthetic teams by a hash
  of their name. A fractional pod uses its share of the GPU's compute and memory.

Slicing (``since`` a date, ``skip`` jobs, then the ``first`` N, or an ``hours`` window) keeps a
replay small. Quotas: ``"equal"`` (the default) splits the cluster evenly over the trace's whole
tenant population, a rule that never looks at the replayed slice; ``"demand"`` gives each tenant
of the slice a guarantee proportional to its demand in that very slice (optimistic: kept to
compare with earlier figures).

Imperfect knowledge: ``memory_error`` (sigma of a log-normal factor) makes the memory the
scheduler is told (``TraceJob.seen_memory_mib``) differ from the job's true peak, as a profile
or a user's request does; the replay runs on the truth and counts what overflowed.

Alibaba pods carry their CPU (``cpu_milli``) and host memory (``memory_mib``) requests and the
nodes their capacities; both go into the trace. ``alibaba_pods`` gives every pod of a list
(CPU-only and never-scheduled ones included) for FGD's fill protocol (``simulate.fill``).
"""

from __future__ import annotations

import csv
import math
import random
import zlib
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from jobs.scheduling.simulate.trace import (
    NodeSpec,
    Trace,
    TraceJob,
    equal_quotas,
    fit_to_cluster,
    proportional_quotas,
    uniform_nodes,
)
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI

GIB = 1024
TRACES_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
PHILLY_CSV = "philly/philly.csv"
ALIBABA_NODES_CSV = "alibaba-gpu-2023/openb_node_list_gpu_node.csv"
ALIBABA_PODS = {
    "default": "alibaba-gpu-2023/openb_pod_list_default.csv",
    "gpushare40": "alibaba-gpu-2023/openb_pod_list_gpushare40.csv",
    "multigpu50": "alibaba-gpu-2023/openb_pod_list_multigpu50.csv",
}
SYNTHETIC_USAGE = "per-job SM utilisation and GPU memory (AntMan-shaped draw, loaders.USAGE_CLASSES)"
# GPU memory of the trace's models. G1-G3 are undisclosed internal models: assumed 32 GiB.
ALIBABA_GPU_MEMORY_MIB = {
    "P100": 16 * GIB, "T4": 16 * GIB, "V100M16": 16 * GIB, "V100M32": 32 * GIB, "A10": 24 * GIB,
    "G1": 32 * GIB, "G2": 32 * GIB, "G3": 32 * GIB,
}

# (share of jobs, utilisation range, peak memory range as a fraction of the GPU). Shaped after
# AntMan's production measurements (most GPUs far from busy; about a tenth above 80% SM
# utilisation) because Philly records neither; every figure built on it says it is synthetic.
USAGE_CLASSES = (
    (0.20, (0.05, 0.30), (0.10, 0.35)),  # debugging, data-bound input pipelines, inference
    (0.50, (0.30, 0.70), (0.25, 0.60)),  # typical training
    (0.20, (0.70, 0.85), (0.40, 0.80)),
    (0.10, (0.85, 1.00), (0.60, 0.95)),  # compute-bound large models
)


def synthetic_usage(key: str, gpu_memory_mib: int, seed: int = 0) -> tuple[float, int]:
    """(solo utilisation, peak memory MiB per GPU) for one job, the same for the same key and seed."""
    rng = random.Random(f"{seed}:{key}")
    draw = rng.random()
    for share, util_range, memory_range in USAGE_CLASSES:
        draw -= share
        if draw < 0:
            break
    utilisation = round(rng.uniform(*util_range), 3)
    memory = int(gpu_memory_mib * rng.uniform(*memory_range))
    return utilisation, max(memory, 256)


def _slice(rows: list, skip: int, first: int | None, hours: float | None, submit) -> list:
    rows = rows[skip:]
    if hours is not None and rows:
        end = submit(rows[0]) + hours * 3600
        rows = [row for row in rows if submit(row) < end]
    if first is not None:
        rows = rows[:first]
    return rows


def _rebase(jobs: list[TraceJob]) -> list[TraceJob]:
    """Times from the first submission of the slice, ids in submit order."""
    if not jobs:
        return jobs
    start = min(job.submit_s for job in jobs)
    return [replace(j, id=i + 1, submit_s=j.submit_s - start)
            for i, j in enumerate(sorted(jobs, key=lambda j: (j.submit_s, j.id)))]


def seen_memory(key: str, true_mib: int | None, error: float, seed: int, gpu_memory_mib: int) -> int | None:
    """The memory the scheduler is told: the truth times a seeded log-normal error (None: exact),
    at most the GPU's (a larger request is refused at submission)."""
    if not error or true_mib is None:
        return None
    factor = random.Random(f"memory:{seed}:{key}").lognormvariate(0.0, error)
    return min(gpu_memory_mib, max(256, int(true_mib * factor)))


def _quotas(rule: str, jobs, population, total_gpus: int):
    if rule == "demand":
        return proportional_quotas(jobs, total_gpus)
    if rule == "equal":
        return equal_quotas(population, total_gpus)
    raise ValueError(f"quota rule {rule!r}: choose equal or demand")


def load_philly(path: str | Path | None = None, *, nodes: int = 64, gpus_per_node: int = 8,
                gpu_model: str = "V100-32GB", gpu_memory_mib: int = 32 * GIB, since: str | None = None, skip: int = 0,
                first: int | None = None, hours: float | None = None, seed: int = 0, quotas: str = "equal",
                memory_error: float = 0.0) -> Trace:
    """``since``: "2017-11-01" or "2017-11-01 08:00:00", the first submission replayed."""
    path = Path(path) if path else TRACES_DIR / PHILLY_CSV
    clusters = set()
    with open(path, newline="") as handle:
        rows = []
        for row in csv.DictReader(handle):
            submitted = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp()
            rows.append((submitted, row))
            clusters.add(row["cluster"])
    rows.sort(key=lambda pair: pair[0])
    if since is not None:
        at = datetime.fromisoformat(since).timestamp()
        rows = [pair for pair in rows if pair[0] >= at]
    rows = _slice(rows, skip, first, hours, submit=lambda pair: pair[0])
    jobs = []
    for number, (submitted, row) in enumerate(rows):
        key = f"philly:{row['timestamp']}:{row['cluster']}:{row['duration']}"
        utilisation, memory = synthetic_usage(key, gpu_memory_mib, seed)
        jobs.append(TraceJob(
            id=number, tenant=row["cluster"], submit_s=submitted, duration_s=max(1.0, float(row["duration"])),
            gpus=max(1, int(row["num_gpus"])), memory_mib=memory, utilisation=utilisation,
            seen_memory_mib=seen_memory(key, memory, memory_error, seed, gpu_memory_mib),
        ))
    cluster = uniform_nodes(nodes, gpus_per_node, gpu_model, gpu_memory_mib)
    kept, skipped = fit_to_cluster(_rebase(jobs), cluster)
    return Trace("philly", tuple(kept), cluster, _quotas(quotas, kept, clusters, sum(n.gpus for n in cluster)),
                 skipped, synthetic=(SYNTHETIC_USAGE,))


def load_alibaba_nodes(path: str | Path | None = None, nodes: int | None = None) -> tuple[NodeSpec, ...]:
    """The node list; ``nodes`` keeps an evenly spaced subset, so the mix of models stays the trace's."""
    path = Path(path) if path else TRACES_DIR / ALIBABA_NODES_CSV
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if int(row["gpu"]) > 0]
    if nodes is not None and nodes < len(rows):
        step = len(rows) / nodes
        rows = [rows[int(i * step)] for i in range(nodes)]
    return tuple(
        NodeSpec(row["sn"], int(row["gpu"]), row["model"], ALIBABA_GPU_MEMORY_MIB.get(row["model"], 32 * GIB),
                 rack=f"rack-{i // 16:03d}", cpu_milli=int(row["cpu_milli"]), host_memory_mb=int(row["memory_mib"]))
        for i, row in enumerate(rows)
    )


def _pod_path(pods: str | Path) -> Path:
    path = Path(ALIBABA_PODS.get(str(pods), pods))
    if not path.is_absolute() and not path.exists():
        path = TRACES_DIR / path
    return path


def _pod_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _pod_job(row: dict, number: int, created: float, duration: float, tenants: int, typical_memory: int,
             usage: str, seed: int, memory_error: float) -> TraceJob:
    gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"]) or WHOLE_GPU_MILLI
    if gpus != 1:
        milli = WHOLE_GPU_MILLI
    if milli < WHOLE_GPU_MILLI or usage == "request" or gpus == 0:
        # A fractional pod asked for that share of one GPU; it uses about that much. "request":
        # every pod is taken at its word (a whole GPU uses the whole GPU).
        utilisation, memory = milli / WHOLE_GPU_MILLI, None
    elif usage == "synthetic":
        utilisation, memory = synthetic_usage(f"alibaba:{row['name']}", typical_memory, seed)
    else:
        raise ValueError(f"usage {usage!r}: choose synthetic or request")
    spec = row.get("gpu_spec") or ""
    return TraceJob(
        id=number, tenant=f"team-{zlib.crc32(row['name'].encode()) % tenants}", submit_s=created,
        duration_s=duration, gpus=gpus, gpu_milli=milli,
        gpu_models=frozenset(m for m in spec.split("|") if m), memory_mib=memory, utilisation=utilisation,
        opportunistic_only=row.get("qos") == "BE", cpu_milli=int(row.get("cpu_milli") or 0),
        host_memory_mb=int(row.get("memory_mib") or 0),
        seen_memory_mib=seen_memory(f"alibaba:{row['name']}", memory, memory_error, seed, typical_memory),
    )


def load_alibaba(pods: str | Path = "default", *, nodes_path: str | Path | None = None, nodes: int | None = None,
                 tenants: int = 4, skip: int = 0, first: int | None = None, hours: float | None = None,
                 seed: int = 0, usage: str = "synthetic", quotas: str = "equal", memory_error: float = 0.0) -> Trace:
    """The GPU pods of a list on the clock, from creation for as long as they ran. CPU-only pods
    (the core places GPU work only) and pods that never ran are left out and counted. A list
    without timestamps gives an untimed trace: every pod at 0, no duration (``Trace.timed``)."""
    path = _pod_path(pods)
    cluster = load_alibaba_nodes(nodes_path, nodes)
    typical_memory = max((n.memory_mib for n in cluster), default=32 * GIB)
    skipped: dict[str, int] = {}
    timed: list[tuple[float, float, dict]] = []
    rows = _pod_rows(path)
    has_times = bool(rows) and rows[0].get("deletion_time") is not None
    for row in rows:
        if int(row["num_gpu"]) == 0:
            skipped["CPU-only pod"] = skipped.get("CPU-only pod", 0) + 1
            continue
        if not has_times:
            timed.append((0.0, math.inf, row))
            continue
        if not row.get("scheduled_time"):
            skipped["never scheduled in the trace"] = skipped.get("never scheduled in the trace", 0) + 1
            continue
        duration = float(row["deletion_time"]) - float(row["scheduled_time"])
        timed.append((float(row.get("creation_time") or 0), max(1.0, duration), row))
    timed.sort(key=lambda entry: entry[0])
    timed = _slice(timed, skip, first, hours, submit=lambda entry: entry[0])
    jobs = [_pod_job(row, number, created, duration, tenants, typical_memory, usage, seed, memory_error)
            for number, (created, duration, row) in enumerate(timed)]
    kept, unfit = fit_to_cluster(_rebase(jobs), cluster)
    for why, count in unfit.items():
        skipped[why] = skipped.get(why, 0) + count
    population = [f"team-{i}" for i in range(tenants)]
    return Trace(f"alibaba-{Path(path).stem}", tuple(kept), cluster,
                 _quotas(quotas, kept, population, sum(n.gpus for n in cluster)), skipped, timed=has_times,
                 synthetic=(SYNTHETIC_USAGE,) if usage == "synthetic" else ())


def alibaba_pods(pods: str | Path = "default", *, tenants: int = 4, usage: str = "synthetic", seed: int = 0,
                 memory_error: float = 0.0) -> list[TraceJob]:
    """Every pod of a list in file order, CPU-only and never-scheduled ones included: FGD's
    workload. Times are not used (the fill protocol has no clock): submit 0, no duration."""
    nodes = load_alibaba_nodes()
    typical_memory = max((n.memory_mib for n in nodes), default=32 * GIB)
    return [_pod_job(row, number + 1, 0.0, math.inf, tenants, typical_memory, usage, seed, memory_error)
            for number, row in enumerate(_pod_rows(_pod_path(pods)))]
