"""Why a job is pending: a code a program can match on and a sentence a researcher can read."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ReasonCode(StrEnum):
    NO_NODES_ONLINE = "no_nodes_online"
    GANG_LARGER_THAN_ANY_NODE = "gang_larger_than_any_node"
    NO_GPU_WITH_ENOUGH_MEMORY = "no_gpu_with_enough_memory"
    WAITING_FOR_FREE_GPUS = "waiting_for_free_gpus"


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: ReasonCode
    message: str
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"code": str(self.code), "message": self.message, "details": dict(self.details)}
