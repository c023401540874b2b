"""The pure scheduler core: a frozen cluster snapshot in, typed decisions out.

No Django, no Redis, no clock: ``now`` is an argument. The production loop
(``jobs.services.scheduling_loop``) and the trace-replay simulator drive the same functions.

Map: ``snapshot`` + ``config`` (inputs) -> ``cycle.decide`` (the policy: its docstring names the
steps; the pass objects ``queues``, ``guaranteed``, ``borrowing``, ``search``, ``outcomes`` and
``waiting`` are handed what they read in ``cycle_state.CycleInputs``, what they change in
``cycle_state.CycleState``, what they reuse in ``cycle_state.Memo``; what the next cycle may reuse
is in ``carry``) using ``capacity`` (indexed working copy), ``filters`` (one ``protocol.Filter``
per constraint in a registry: GPU model and memory, gang width, container runtime, compute room,
exclusivity, isolation, cordon, CPU and host memory), ``placement`` + ``topology`` (where;
``fragmentation_score`` ranks the candidates by FGD's gradient of ``fragmentation``), ``reclaim``
(victims), ``reservation`` (gang starvation guard), ``user_limits`` (a lead's per-member caps),
``duty_cycles`` (AIMD duty cycles), ``eta``, ``explain`` + ``reasons`` (why pending) ->
``decisions`` (outputs).
``usage`` holds the fair-share decay the service keeps; ``policies`` the baselines the trace
replay compares.
"""

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.cycle import decide
from jobs.scheduling.decisions import (
    Decisions,
    NodeSlice,
    Pending,
    Place,
    Preempt,
    PreemptReason,
    Rendezvous,
    Reservation,
    Throttle,
    ThrottleReason,
)
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.scheduling.snapshot import (
    ClusterSnapshot,
    GpuState,
    JobClass,
    RecordedProfile,
    JobRequest,
    LiveReadings,
    NodeState,
    Promise,
    RunningJob,
    TenantQuota,
    UserLimit,
)
from jobs.scheduling.usage import decay_usage

__all__ = [
    "ClusterSnapshot",
    "Decisions",
    "GpuState",
    "JobClass",
    "RecordedProfile",
    "JobRequest",
    "LiveReadings",
    "NodeSlice",
    "NodeState",
    "Pending",
    "PendingReason",
    "Place",
    "Preempt",
    "Promise",
    "PreemptReason",
    "ReasonCode",
    "Rendezvous",
    "Reservation",
    "RunningJob",
    "SchedulerConfig",
    "TenantQuota",
    "Throttle",
    "ThrottleReason",
    "UserLimit",
    "decay_usage",
    "decide",
]
