"""What the core decides; the service layer (``jobs.services.apply``) carries it out."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.scheduling.reasons import PendingReason


@dataclass(frozen=True, slots=True)
class Place:
    job_id: int
    node: str
    gpu_ids: tuple[int, ...]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Pending:
    job_id: int
    reason: PendingReason


@dataclass(frozen=True, slots=True)
class Decisions:
    placements: tuple[Place, ...] = field(default=())
    pending: tuple[Pending, ...] = field(default=())
