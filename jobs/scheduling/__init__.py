"""The pure scheduler core: a frozen cluster snapshot in, typed decisions out.

No Django, no Redis, no clock: ``now`` is an argument. The production loop
(``jobs.services.cycle``) and the trace-replay simulator drive the same functions.
"""

from jobs.scheduling.decisions import Decisions, Pending, Place
from jobs.scheduling.fifo import decide
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.scheduling.snapshot import ClusterSnapshot, GpuState, JobRequest, NodeState, TenantQuota

__all__ = [
    "ClusterSnapshot",
    "Decisions",
    "GpuState",
    "JobRequest",
    "NodeState",
    "Pending",
    "PendingReason",
    "Place",
    "ReasonCode",
    "TenantQuota",
    "decide",
]
