"""Build the scheduler core's ClusterSnapshot from the database and Redis.

The database says what exists and who holds what; Redis adds liveness (heartbeats) and live
usage (each node's latest sample). Queries are a fixed handful per cycle, never per job.
"""

from __future__ import annotations

from collections import defaultdict

from jobs.choices import JobClass as JobClassChoice
from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Allocation, Job, JobDependency, JobProfile, Tenant
from jobs.scheduling import ClusterSnapshot, GpuState, JobRequest, NodeState, TenantQuota
from jobs.scheduling.snapshot import JobClass, JobProfile as CoreProfile, RunningJob
from monitoring.models import Gpu, JobUsage, Node
from monitoring.services import live
from monitoring.services.health import live_node_names

# Slowest GPU-to-GPU link inside a node, GB/s, when the agent reported no usable topology.
PCIE_GB_PER_S = 32.0
# Agents report NVLink bandwidth in Gbit/s.
BITS_PER_BYTE = 8


def build_snapshot(redis_client) -> ClusterSnapshot:
    nodes = list(Node.objects.all())
    online = live_node_names(redis_client, [node.name for node in nodes])
    samples = live.latest_nodes(redis_client)
    node_states = _nodes(nodes, online, samples)
    gpu_nodes = {gpu.id: node.name for node in node_states for gpu in node.gpus}
    gpu_memory = {gpu.id: gpu.memory_mib for node in node_states for gpu in node.gpus}
    return ClusterSnapshot(
        nodes=node_states,
        pending=_pending(max(gpu_memory.values(), default=None)),
        tenants=tuple(
            TenantQuota(name=t.slug, guaranteed_gpus=t.guaranteed_gpus, max_gpus=t.max_gpus, weight=t.weight,
                        decayed_usage=t.decayed_usage)
            for t in Tenant.objects.all()
        ),
        running=_running(samples, gpu_nodes, gpu_memory),
    )


def intra_node_bandwidth(topology: list[dict]) -> float:
    if topology and all(link["kind"] == "nvlink" and link.get("bandwidth_gbps") for link in topology):
        return min(link["bandwidth_gbps"] for link in topology) / BITS_PER_BYTE
    return PCIE_GB_PER_S


def _nodes(nodes: list[Node], online: set[str], samples: dict[str, dict]) -> tuple[NodeState, ...]:
    gpus_by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.filter(present=True).order_by("index"):
        gpus_by_node[gpu.node_id].append(gpu)
    states = []
    for node in nodes:
        readings = {g["index"]: g for g in samples.get(node.name, {}).get("gpus", [])}
        states.append(NodeState(
            name=node.name,
            gpus=tuple(
                GpuState(
                    id=gpu.id, index=gpu.index, model=gpu.model, memory_mib=gpu.memory_mib,
                    utilisation=_fraction(readings.get(gpu.index, {}).get("util_sm")),
                    memory_used_mib=readings.get(gpu.index, {}).get("mem_used_mib"),
                )
                for gpu in gpus_by_node[node.id]
            ),
            online=node.name in online,
            cordoned=node.cordoned,
            rack=node.rack,
            intra_node_gb_per_s=intra_node_bandwidth(node.topology),
            runtimes=frozenset(node.runtimes or ()),
        ))
    return tuple(states)


def _fraction(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _profiles(tenant_keys: set[tuple[int, str]]) -> dict[tuple[int, str], JobProfile]:
    if not tenant_keys:
        return {}
    keys = {key for _, key in tenant_keys}
    return {
        (p.tenant_id, p.key): p
        for p in JobProfile.objects.filter(key__in=keys)
        if (p.tenant_id, p.key) in tenant_keys
    }


PENDING_FIELDS = ("id", "tenant_id", "tenant__slug", "gpus", "submitted_at", "gpu_memory_mib", "priority",
                  "gpu_milli", "gpu_models", "opportunistic_only", "shareable", "max_nodes", "max_runtime_s",
                  "profile_key", "reserved_since", "image", "array_id", "array__max_running")


def _pending(largest_gpu_mib: int | None = None) -> tuple[JobRequest, ...]:
    # Plain tuples, not model instances: with 50,000 pending jobs this is the bulk of the snapshot.
    rows = [dict(zip(PENDING_FIELDS, row)) for row in
            Job.objects.filter(state=JobState.PENDING).values_list(*PENDING_FIELDS)]
    profiles = _profiles({(row["tenant_id"], row["profile_key"]) for row in rows if row["profile_key"]})
    waiting_for = _unfinished_dependencies()
    requests = []
    for row in rows:
        profile = profiles.get((row["tenant_id"], row["profile_key"])) if row["profile_key"] else None
        requests.append(JobRequest(
            id=row["id"], tenant=row["tenant__slug"], gpus=row["gpus"], submitted_at=row["submitted_at"].timestamp(),
            gpu_memory_mib=row["gpu_memory_mib"], priority=row["priority"], gpu_milli=row["gpu_milli"],
            gpu_models=frozenset(row["gpu_models"]), opportunistic_only=row["opportunistic_only"],
            shareable=row["shareable"], max_nodes=row["max_nodes"],
            profile=CoreProfile(peak_memory_mib=_bounded(profile.peak_gpu_memory_mib, largest_gpu_mib),
                                mean_utilisation=profile.mean_util if profile.mean_util is not None else 1.0)
            if profile else None,
            expected_runtime_s=_expected_runtime(row["max_runtime_s"], profile),
            reserved_since=row["reserved_since"].timestamp() if row["reserved_since"] else None,
            needs_runtime=bool(row["image"]), array_id=row["array_id"], array_limit=row["array__max_running"],
            waiting_for=waiting_for.get(row["id"], ()),
        ))
    return tuple(requests)


def _unfinished_dependencies() -> dict[int, tuple[tuple[int, str], ...]]:
    """Per pending job, the jobs it depends on that have not ended (one query for the whole queue).
    A dependency that ended is dropped here whatever its outcome: cancelling a job whose after_ok
    dependency failed is the lifecycle's business, not the scheduler's."""
    waiting: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for job_id, on_id, kind in (JobDependency.objects.filter(job__state=JobState.PENDING)
                                .exclude(on__state__in=TERMINAL_STATES)
                                .order_by("job_id", "on_id").values_list("job_id", "on_id", "kind")):
        waiting[job_id].append((on_id, kind))
    return {job_id: tuple(deps) for job_id, deps in waiting.items()}


def _expected_runtime(max_runtime_s: int | None, profile: JobProfile | None) -> float | None:
    if profile and profile.mean_runtime_s:
        return profile.mean_runtime_s if not max_runtime_s else min(profile.mean_runtime_s, max_runtime_s)
    return float(max_runtime_s) if max_runtime_s else None


def _bounded(peak_mib: int, largest_gpu_mib: int | None) -> int:
    """A profile's peak as the scheduler sees it: never above the largest GPU there is, so a peak a
    node lied into a profile (or one recorded on a GPU since removed) cannot leave its key unplaceable."""
    return min(peak_mib, largest_gpu_mib) if largest_gpu_mib else peak_mib


def _running(samples: dict[str, dict], gpu_nodes: dict[int, str],
             gpu_memory: dict[int, int] | None = None) -> tuple[RunningJob, ...]:
    allocations = list(
        # Every live allocation holds its GPU, whatever the job's state: a job settled while its
        # node may still run it (timed out by the control plane) keeps its GPUs until the exit.
        Allocation.objects.filter(released_at__isnull=True)
        .select_related("job__tenant").order_by("job_id", "rank", "gpu__index")
    )
    by_job: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in allocations:
        by_job[allocation.job_id].append(allocation)
    usage = {u.job_id: u for u in JobUsage.objects.filter(job_id__in=by_job)}
    jobs = {a.job_id: a.job for a in allocations}
    profiles = _profiles({(j.tenant_id, j.profile_key) for j in jobs.values() if j.profile_key})
    live_util = _live_job_utilisation(samples, {job_id: {gpu_nodes.get(a.gpu_id) for a in held}
                                                for job_id, held in by_job.items()})
    running = []
    for job_id, held in by_job.items():
        job = jobs[job_id]
        observed = usage.get(job_id)
        profile = profiles.get((job.tenant_id, job.profile_key)) if job.profile_key else None
        started = job.started_at or job.placed_at or job.submitted_at
        running.append(RunningJob(
            id=job_id, tenant=job.tenant.slug,
            job_class=JobClass.OPPORTUNISTIC if job.run_class == JobClassChoice.OPPORTUNISTIC else JobClass.GUARANTEED,
            gpu_ids=tuple(a.gpu_id for a in held),
            started_at=started.timestamp(),
            memory_mib=_memory_estimate(observed, held[0], job, profile,
                                        max((gpu_memory or {}).get(a.gpu_id, 0) for a in held) or None),
            gpu_milli=job.gpu_milli, priority=job.priority,
            expected_runtime_s=_expected_runtime(job.max_runtime_s, profile),
            duty_cycle=held[0].duty_cycle,
            utilisation=live_util.get(job_id),
            solo_utilisation=profile.mean_util if profile else None,
            shareable=job.shareable,
            preempting=job.state not in (JobState.PLACED, JobState.RUNNING),
            checkpoints=job.checkpoints,
            array_id=job.array_id,
        ))
    return tuple(running)


def _memory_estimate(observed: JobUsage | None, allocation: Allocation, job: Job,
                     profile: JobProfile | None, held_gpu_mib: int | None = None) -> int | None:
    """Per-GPU memory the job holds: observed peak, else its limit, request or profile; None = all.
    Never more than the largest GPU it holds (``held_gpu_mib``): node-reported peaks are untrusted."""
    if observed and observed.peak_gpu_memory_mib:
        return _bounded(observed.peak_gpu_memory_mib, held_gpu_mib)
    return allocation.memory_limit_mib or job.gpu_memory_mib or (
        _bounded(profile.peak_gpu_memory_mib, held_gpu_mib) if profile else None)


def _live_job_utilisation(samples: dict[str, dict], nodes_of: dict[int, set[str]]) -> dict[int, float]:
    """Each job's mean live utilisation, from the nodes it holds GPUs on only: what another node
    says about it (a bug, or a node lying) must not move its throttling."""
    readings: dict[int, list[float]] = defaultdict(list)
    for node, sample in samples.items():
        for usage in sample.get("jobs", []):
            if usage.get("util_sm") is not None and node in nodes_of.get(usage.get("job_id"), ()):
                readings[usage["job_id"]].append(usage["util_sm"] / 100.0)
    return {job_id: sum(values) / len(values) for job_id, values in readings.items()}
