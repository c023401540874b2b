"""What a replay runs: jobs with their solo runtimes, the cluster they run on, the tenants' quotas.

A ``Trace`` is plain data. Loaders for the public traces live in ``loaders``; ``colony_trace``
reads and writes the JSON form that ``manage.py export_trace`` produces, and ``quota_file``
reads an operator's proposed quotas. Nothing here knows about policies or the clock.

Units as in ``jobs.scheduling.snapshot``: memory in MiB per GPU, compute in milli-GPUs,
utilisation 0..1, times in seconds from the start of the trace.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, TenantQuota

TRACE_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: int
    tenant: str
    submit_s: float
    # Runtime when alone on its GPUs at full duty cycle.
    duration_s: float
    gpus: int
    gpu_milli: int = WHOLE_GPU_MILLI
    gpu_models: frozenset[str] = frozenset()
    # Peak memory per GPU; None = the whole GPU (the request of a job that says nothing).
    memory_mib: int | None = None
    # SM utilisation when alone: what the job adds to a shared GPU's load.
    utilisation: float = 1.0
    opportunistic_only: bool = False
    priority: int = 0
    # Host resources for the whole job (all its GPUs; a gang spread over nodes splits them in
    # proportion to its GPUs per node). 0 = asks for none. ``gpus == 0``: a CPU-only pod.
    cpu_milli: int = 0
    host_memory_mb: int = 0
    # What the scheduler is told about the job's peak memory per GPU before it runs (a profile,
    # a request); None = the true peak (perfect knowledge). See ``knowledge``.
    seen_memory_mib: int | None = None

    @property
    def gpu_seconds(self) -> float:
        return self.duration_s * self.gpus * self.gpu_milli / WHOLE_GPU_MILLI


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: int
    model: str
    memory_mib: int
    rack: str = ""
    intra_node_gb_per_s: float = 32.0
    # Host CPU and memory; None = not tracked (unconstrained).
    cpu_milli: int | None = None
    host_memory_mb: int | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    nodes: tuple[NodeSpec, ...]
    quotas: tuple[TenantQuota, ...] = ()
    # Jobs the loader left out and why (e.g. "larger than the cluster": 3), for the report.
    skipped: dict[str, int] = field(default_factory=dict)
    # False for a pod list without timestamps: every job arrives at 0 with no real duration, so
    # only the fill protocol may be run on it and no JCT may be read from it.
    timed: bool = True
    # What the figures of this trace rest on that the trace itself does not record
    # (e.g. "per-job utilisation and memory"), printed beside them.
    synthetic: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    @property
    def tenants(self) -> list[str]:
        return sorted({job.tenant for job in self.jobs})

    def with_quotas(self, quotas: tuple[TenantQuota, ...]) -> "Trace":
        return replace(self, quotas=quotas)


def uniform_nodes(count: int, gpus_per_node: int, model: str, memory_mib: int,
                  nodes_per_rack: int = 8, intra_node_gb_per_s: float = 300.0) -> tuple[NodeSpec, ...]:
    return tuple(
        NodeSpec(f"node-{i:04d}", gpus_per_node, model, memory_mib, rack=f"rack-{i // nodes_per_rack:03d}",
                 intra_node_gb_per_s=intra_node_gb_per_s)
        for i in range(count)
    )


def fit_to_cluster(jobs: list[TraceJob], nodes: tuple[NodeSpec, ...]) -> tuple[list[TraceJob], dict[str, int]]:
    """Drop jobs that no placement on these nodes could ever hold, so every replayed job can end."""
    total = sum(node.gpus for node in nodes)
    models = {node.model for node in nodes}
    kept, skipped = [], {}
    for job in jobs:
        if job.gpus > total:
            why = "needs more GPUs than the cluster has"
        elif job.gpu_models and not job.gpu_models & models:
            why = "asks for a GPU model the cluster lacks"
        elif job.gpus > sum(n.gpus for n in nodes if not job.gpu_models or n.model in job.gpu_models):
            why = "needs more GPUs of its model than the cluster has"
        else:
            kept.append(job)
            continue
        skipped[why] = skipped.get(why, 0) + 1
    return kept, skipped


def equal_quotas(tenants, total_gpus: int, share_of_cluster: float = 1.0,
                 borrow: bool = True) -> tuple[TenantQuota, ...]:
    """The same guarantee for every tenant of the trace's population (not of the slice), summing
    to ``share_of_cluster`` of the cluster: a rule that does not look at the replayed demand."""
    names = sorted(set(tenants))
    if not names:
        return ()
    budget = int(total_gpus * share_of_cluster)
    base, extra = divmod(budget, len(names))
    return tuple(TenantQuota(name, guaranteed_gpus=base + (i < extra),
                             max_gpus=total_gpus if borrow else base + (i < extra))
                 for i, name in enumerate(names))


def proportional_quotas(jobs: list[TraceJob] | tuple[TraceJob, ...], total_gpus: int,
                        share_of_cluster: float = 1.0, borrow: bool = True) -> tuple[TenantQuota, ...]:
    """Guarantees proportional to each tenant's GPU-time demand, summing to ``share_of_cluster``
    of the cluster (largest remainder rounding); ceilings at the whole cluster when borrowing.

    Work that may only run opportunistically does not earn its tenant a guarantee.
    """
    demand: dict[str, float] = {}
    for job in jobs:
        demand.setdefault(job.tenant, 0.0)
        if not job.opportunistic_only:
            demand[job.tenant] += job.gpu_seconds
    total_demand = sum(demand.values())
    budget = int(total_gpus * share_of_cluster)
    if total_demand <= 0:
        exact = dict.fromkeys(demand, 0.0)
    else:
        exact = {tenant: budget * d / total_demand for tenant, d in demand.items()}
    floors = {tenant: int(value) for tenant, value in exact.items()}
    left = budget - sum(floors.values())
    for tenant in sorted(exact, key=lambda t: (floors[t] - exact[t], t))[:max(left, 0)]:
        floors[tenant] += 1
    return tuple(
        TenantQuota(tenant, guaranteed_gpus=floors[tenant],
                    max_gpus=total_gpus if borrow else floors[tenant])
        for tenant in sorted(demand)
    )


# -- the JSON trace (manage.py export_trace) and quota files --------------------------------------

def write_colony_trace(trace: Trace, path: str | Path) -> None:
    def job_dict(job: TraceJob) -> dict:
        row = asdict(job)
        row["gpu_models"] = sorted(job.gpu_models)
        return row

    document = {
        "format": "colony-trace",
        "version": TRACE_FORMAT_VERSION,
        "name": trace.name,
        "nodes": [asdict(node) for node in trace.nodes],
        "quotas": [asdict(quota) for quota in trace.quotas],
        "jobs": [job_dict(job) for job in trace.jobs],
    }
    Path(path).write_text(json.dumps(document, indent=1))


class TraceFormatError(ValueError):
    pass


def read_colony_trace(path: str | Path) -> Trace:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a readable JSON trace ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != "colony-trace":
        raise TraceFormatError(f"{path}: not a Colony trace (no \"format\": \"colony-trace\")")
    if document.get("version") != TRACE_FORMAT_VERSION:
        raise TraceFormatError(
            f"{path}: trace version {document.get('version')!r}, this Colony reads {TRACE_FORMAT_VERSION}")
    try:
        jobs = tuple(
            TraceJob(**{**row, "gpu_models": frozenset(row.get("gpu_models", ()))}) for row in document["jobs"]
        )
        nodes = tuple(NodeSpec(**row) for row in document["nodes"])
        quotas = tuple(TenantQuota(**row) for row in document.get("quotas", ()))
    except (KeyError, TypeError) as exc:
        raise TraceFormatError(f"{path}: malformed trace entry ({exc})") from exc
    return Trace(document.get("name", Path(path).stem), jobs, nodes, quotas)


def read_quota_file(path: str | Path, trace: Trace) -> tuple[TenantQuota, ...]:
    """Proposed quotas, as JSON: ``{"tenants": {"vision": {"guaranteed_gpus": 8, "max_gpus": 16,
    "weight": 1.0}, ...}}``. Tenants of the trace that the file does not name get no guarantee
    and may borrow up to the whole cluster, so a what-if names only what it changes."""
    try:
        document = json.loads(Path(path).read_text())
        entries = document["tenants"]
        if not isinstance(entries, dict):
            raise TypeError("\"tenants\" must be an object")
        named = {
            name: TenantQuota(name, guaranteed_gpus=int(spec.get("guaranteed_gpus", 0)),
                              max_gpus=int(spec.get("max_gpus", trace.total_gpus)),
                              weight=float(spec.get("weight", 1.0)))
            for name, spec in entries.items()
        }
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{path}: not a quota file ({exc})") from exc
    for quota in named.values():
        if quota.guaranteed_gpus < 0 or quota.max_gpus < 0 or quota.weight <= 0:
            raise TraceFormatError(f"{path}: tenant {quota.name}: GPUs must be >= 0 and weight > 0")
    others = tuple(TenantQuota(t, 0, trace.total_gpus) for t in trace.tenants if t not in named)
    return tuple(sorted((*named.values(), *others), key=lambda q: q.name))


def offered_load(trace: Trace) -> float | None:
    """GPU-time the jobs ask for over the cluster's GPU-time between the first and the last
    arrival: above 1 the queue must grow, below 1 a work-conserving scheduler can keep up."""
    if not trace.timed or len(trace.jobs) < 2:
        return None
    span = max(j.submit_s for j in trace.jobs) - min(j.submit_s for j in trace.jobs)
    if span <= 0 or not trace.total_gpus:
        return None
    return sum(j.gpu_seconds for j in trace.jobs) / (trace.total_gpus * span)
