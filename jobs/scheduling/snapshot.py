"""Frozen inputs of the scheduler core: what the cluster has and what is waiting."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuState:
    id: int
    index: int
    model: str
    memory_mib: int
    busy: bool = False


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...]
    online: bool = True
    cordoned: bool = False

    @property
    def schedulable(self) -> bool:
        return self.online and not self.cordoned

    def free_gpus(self, min_memory_mib: int = 0) -> list[GpuState]:
        return [gpu for gpu in self.gpus if not gpu.busy and gpu.memory_mib >= min_memory_mib]


@dataclass(frozen=True, slots=True)
class JobRequest:
    id: int
    tenant: str
    gpus: int
    submitted_at: float
    gpu_memory_mib: int | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class TenantQuota:
    name: str
    guaranteed_gpus: int
    max_gpus: int
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeState, ...]
    pending: tuple[JobRequest, ...]
    tenants: tuple[TenantQuota, ...] = field(default=())
