"""Small fluent builders for scheduler-core tests, in the manner of Kueue's ``MakeWorkload``:

    cluster(node("a", gpus=4), tenants=[tenant("nlp", guaranteed=4)],
            running=[running(7, on="a", gpus=[0, 1], tenant="cv", opportunistic=True)],
            pending=[job(1, tenant="nlp", gpus=2)])

``running(...)`` names GPUs by node and index; ``cluster`` resolves them to GPU ids. GPU ids come
from a global counter, so tests never depend on their values. Live readings (``util=``) are
remembered by GPU or job id and handed over as the snapshot's ``LiveReadings`` by ``cluster``
(or ``readings``, for a snapshot built by hand).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from jobs.scheduling import (
    ClusterSnapshot,
    GpuState,
    JobClass,
    RecordedProfile,
    JobRequest,
    LiveReadings,
    NodeState,
    RunningJob,
    TenantQuota,
)

_ids = itertools.count(1)
GIB = 1024
# What ``node(util=...)`` said of each GPU it made (by the GpuState itself: a GPU built by hand
# with another test's id is another GPU).
_gpu_utilisation: dict[GpuState, float] = {}


def node(name: str, gpus: int = 8, mem_gib: int = 80, model: str = "A100-80GB", busy: int = 0,
         online: bool = True, cordoned: bool = False, rack: str = "r1", gb_per_s: float = 32.0,
         util: float | dict[int, float] | None = None, runtimes: tuple[str, ...] = (), cpus: float | None = None,
         ram_gib: float | None = None, isolation: str = "memory_limit", mig: tuple[str, ...] = ()) -> NodeState:
    """A node whose first ``busy`` GPUs are taken by something unknown; ``util`` is live GPU use;
    ``cpus``/``ram_gib``: CPU cores and host memory it offers (None: not tracked); ``isolation``:
    every GPU's mode; ``mig``: one MIG instance per profile named (its memory from the name),
    listed after the ``gpus`` whole GPUs."""
    def read(gpu: GpuState) -> GpuState:
        reading = util.get(gpu.index) if isinstance(util, dict) else util
        if reading is not None:
            _gpu_utilisation[gpu] = reading
        return gpu

    return NodeState(
        name=name,
        gpus=tuple(
            read(GpuState(id=next(_ids), index=i, model=model, memory_mib=mem_gib * GIB, busy=i < busy,
                          isolation=isolation))
            for i in range(gpus)
        ) + tuple(
            GpuState(id=next(_ids), index=gpus + i, model=model, isolation="mig", mig_profile=profile,
                     memory_mib=int(profile.split(".")[-1].removesuffix("gb")) * GIB)
            for i, profile in enumerate(mig)
        ),
        online=online, cordoned=cordoned, rack=rack, intra_node_gb_per_s=gb_per_s, runtimes=frozenset(runtimes),
        cpu_milli=None if cpus is None else int(cpus * 1000),
        host_memory_mb=None if ram_gib is None else int(ram_gib * GIB),
    )


def nodes(count: int, gpus: int = 8, mem_gib: int = 80, racks: int = 1, **kwargs) -> list[NodeState]:
    """``count`` identical nodes n0, n1, ... spread round-robin over ``racks`` racks."""
    return [node(f"n{i}", gpus=gpus, mem_gib=mem_gib, rack=f"r{i % racks}", **kwargs) for i in range(count)]


def tenant(name: str, guaranteed: int = 0, max_gpus: int | None = None, weight: float = 1.0,
           usage: float = 0.0) -> TenantQuota:
    return TenantQuota(name=name, guaranteed_gpus=guaranteed,
                       max_gpus=max(guaranteed, 10**6) if max_gpus is None else max_gpus,
                       weight=weight, decayed_usage=usage)


def job(id: int, gpus: int = 1, mem_gib: float | None = None, submitted_at: float = 0.0, priority: int = 0,
        tenant: str = "vision", milli: int = 1000, models: tuple[str, ...] = (), opportunistic_only: bool = False,
        shareable: bool = False, profile: tuple[float, float] | None = None, runtime: float | None = None,
        max_nodes: int | None = None, reserved_since: float | None = None, array: tuple[int, int] | None = None,
        waiting_for: tuple[tuple[int, str], ...] = (), image: bool = False, cpus: float = 0,
        ram_gib: float = 0, mig: str | None = None, unfenced: bool = True) -> JobRequest:
    """``profile=(peak_gib, mean_utilisation)`` attaches a recorded profile; ``array=(id, limit)``;
    ``cpus``/``ram_gib``: the whole job's CPU cores and host memory."""
    return JobRequest(
        id=id, tenant=tenant, gpus=gpus, submitted_at=submitted_at or float(id), priority=priority,
        gpu_memory_mib=int(mem_gib * GIB) if mem_gib else None, gpu_milli=milli, gpu_models=frozenset(models),
        opportunistic_only=opportunistic_only, shareable=shareable,
        profile=RecordedProfile(int(profile[0] * GIB), profile[1]) if profile else None,
        expected_runtime_s=runtime, max_nodes=max_nodes, reserved_since=reserved_since,
        array_id=array[0] if array else None, array_limit=array[1] if array else None, waiting_for=waiting_for,
        needs_runtime=image, cpu_milli=int(cpus * 1000), host_memory_mb=int(ram_gib * GIB),
        mig_profile=mig, accepts_unfenced=unfenced,
    )


@dataclass(frozen=True)
class RunningSpec:
    id: int
    on: str
    gpus: tuple[int, ...]
    fields: dict
    util: float | None = None  # its live reading


def running(id: int, on: str = "a", gpus=(0,), tenant: str = "vision", opportunistic: bool = False,
            mem_gib: float | None = None, started_at: float = 0.0, runtime: float | None = None,
            util: float | None = None, solo: float | None = None, duty: float = 1.0, milli: int = 1000,
            shareable: bool = False, preempting: bool = False, attained: float = 0.0, checkpoints: bool = False,
            array: int | None = None, cpus: float = 0, ram_gib: float = 0, unfenced: bool = True) -> RunningSpec:
    return RunningSpec(id, on, tuple(gpus), dict(
        tenant=tenant, job_class=JobClass.OPPORTUNISTIC if opportunistic else JobClass.GUARANTEED,
        started_at=started_at, memory_mib=int(mem_gib * GIB) if mem_gib else None, expected_runtime_s=runtime,
        solo_utilisation=solo, duty_cycle=duty, gpu_milli=milli, shareable=shareable,
        preempting=preempting, attained_gpu_s=attained, checkpoints=checkpoints, array_id=array,
        cpu_milli=int(cpus * 1000), host_memory_mb=int(ram_gib * GIB), accepts_unfenced=unfenced), util)


def readings(node_states, jobs: dict[int, float] | None = None) -> LiveReadings:
    """The live readings of these nodes' GPUs (as ``node(util=...)`` gave them) and of ``jobs``."""
    return LiveReadings(gpus={g.id: _gpu_utilisation[g] for n in node_states for g in n.gpus
                              if g in _gpu_utilisation}, jobs=dict(jobs or {}))


def cluster(*node_states: NodeState, pending=(), running=(), tenants=()) -> ClusterSnapshot:
    by_name = {n.name: n for n in node_states}
    jobs, utilisation = [], {}
    for spec in running:
        if isinstance(spec, RunningJob):
            jobs.append(spec)
            continue
        gpu_ids = tuple(by_name[spec.on].gpus[i].id for i in spec.gpus)
        jobs.append(RunningJob(id=spec.id, gpu_ids=gpu_ids, **spec.fields))
        if spec.util is not None:
            utilisation[spec.id] = spec.util
    return ClusterSnapshot(nodes=tuple(node_states), pending=tuple(pending), tenants=tuple(tenants),
                           running=tuple(jobs), readings=readings(node_states, utilisation))


def gpu_index(snapshot: ClusterSnapshot) -> dict[int, tuple[str, int]]:
    """GPU id -> (node name, index), for asserting where things landed."""
    return {g.id: (n.name, g.index) for n in snapshot.nodes for g in n.gpus}


# -- reading decisions ------------------------------------------------------------------------

def placed(decisions) -> dict[int, str]:
    """job id -> node (the master node for multi-node placements)."""
    return {p.job_id: p.node for p in decisions.placements}


def classes(decisions) -> dict[int, str]:
    return {p.job_id: str(p.job_class) for p in decisions.placements}


def codes(decisions) -> dict[int, str]:
    return {p.job_id: str(p.reason.code) for p in decisions.pending}


def preempted(decisions) -> list[int]:
    return [p.job_id for p in decisions.preemptions]


def pending_of(decisions, job_id: int):
    return next(p for p in decisions.pending if p.job_id == job_id)
