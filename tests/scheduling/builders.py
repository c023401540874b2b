"""Small fluent builders for scheduler-core tests: ``cluster(nodes=2, gpus=8)``, ``job(gpus=4)``."""

from __future__ import annotations

import itertools

from jobs.scheduling import ClusterSnapshot, GpuState, JobRequest, NodeState

_ids = itertools.count(1)


def node(name: str, gpus: int = 8, mem_gib: int = 80, model: str = "A100-80GB", busy: int = 0,
         online: bool = True, cordoned: bool = False) -> NodeState:
    """A node whose first ``busy`` GPUs are taken."""
    return NodeState(
        name=name,
        gpus=tuple(
            GpuState(id=next(_ids), index=i, model=model, memory_mib=mem_gib * 1024, busy=i < busy)
            for i in range(gpus)
        ),
        online=online,
        cordoned=cordoned,
    )


def cluster(*nodes: NodeState, pending=()) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=tuple(nodes), pending=tuple(pending))


def job(id: int, gpus: int = 1, mem_gib: float | None = None, submitted_at: float = 0.0, priority: int = 0,
        tenant: str = "vision") -> JobRequest:
    return JobRequest(id=id, tenant=tenant, gpus=gpus, submitted_at=submitted_at or float(id), priority=priority,
                      gpu_memory_mib=int(mem_gib * 1024) if mem_gib else None)
