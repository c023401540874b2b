"""Which jobs hold a GPU now, as one user may read it (the node page's "Jobs on it").

Allocations live in the ``jobs`` app, which ``monitoring`` must not import, and only ``jobs`` can
tell whom a job may be named to; so ``jobs`` installs the lookup when it loads
(:meth:`jobs.apps.JobsConfig.ready`), as it installs :mod:`monitoring.services.placements`.
Without one (monitoring used alone) nothing is known to hold a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuHolder:
    """One job holding (part of) a GPU. ``job_id``, ``job_name`` and ``tenant`` are None for a job
    the reader may not see; ``label`` is what to show then."""

    job_id: int | None
    job_name: str | None
    tenant: str | None
    label: str
    gpu_milli: int
    duty_cycle: float


# (user, GPU ids) -> GPU id -> its holders now, oldest first.
HolderLookup = Callable[[object, list[int]], dict[int, list[GpuHolder]]]

_lookup: HolderLookup | None = None


def install(lookup: HolderLookup) -> None:
    global _lookup
    _lookup = lookup


def holders(user, gpu_ids: Iterable[int]) -> dict[int, list[GpuHolder]]:
    gpu_ids = list(gpu_ids)
    if _lookup is None or not gpu_ids:
        return {}
    return _lookup(user, gpu_ids)
