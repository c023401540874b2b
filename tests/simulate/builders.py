"""Tiny hand-made traces for replay tests: ``trace(jobs=[tjob(...)], nodes=[(name, gpus)])``."""

from __future__ import annotations

from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob
from jobs.scheduling.snapshot import TenantQuota

GIB = 1024


def tjob(id: int, submit: float = 0.0, duration: float = 100.0, gpus: int = 1, tenant: str = "vision",
         util: float = 1.0, mem_gib: float | None = 10, milli: int = 1000,
         opportunistic_only: bool = False) -> TraceJob:
    return TraceJob(id=id, tenant=tenant, submit_s=submit, duration_s=duration, gpus=gpus, gpu_milli=milli,
                    memory_mib=int(mem_gib * GIB) if mem_gib is not None else None, utilisation=util,
                    opportunistic_only=opportunistic_only)


def trace(jobs, nodes=(("a", 1),), quotas=(), mem_gib: int = 80) -> Trace:
    specs = tuple(NodeSpec(name, gpus, "A100-80GB", mem_gib * GIB, rack="r1") for name, gpus in nodes)
    return Trace("hand-made", tuple(jobs), specs, tuple(TenantQuota(*q) for q in quotas))
