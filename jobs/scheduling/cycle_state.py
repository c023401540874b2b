"""What one ``decide()`` reads (``CycleInputs``), changes as it goes (``CycleState``) and reuses
(``Memo``): the three things every pass object of the cycle is handed in its constructor.

``CycleInputs`` is fixed when the cycle starts (snapshot, clock, config, the carry, the capacity
indexes, the placer, the inventory check, quotas). Splitting the mutable facts out makes it plain
what a pass can change and what a cached answer depends on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from jobs.scheduling.capacity import Capacity, NodeSlot
from jobs.scheduling.carry import UNLIMITED_GPUS, Carry
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Pending, Place, Preempt, Reservation
from jobs.scheduling.explain import InventoryCheck
from jobs.scheduling.interned_reasons import InternedReasons
from jobs.scheduling.placement import FailureMemo, Placer
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import ClusterSnapshot, JobRequest, Promise, TenantQuota


@dataclass(slots=True, eq=False)
class CycleInputs:
    """What every pass reads and none changes (the capacity's contents change with placements,
    through ``Capacity``'s own methods; which object it is does not)."""

    snapshot: ClusterSnapshot
    now: float
    config: SchedulerConfig
    carry: Carry
    capacity: Capacity
    placer: Placer
    inventory: InventoryCheck
    quotas: dict[str, TenantQuota]

    def quota(self, tenant: str) -> TenantQuota:
        quota = self.quotas.get(tenant)
        if quota is None:  # unknown tenant (simulator, tests): no guarantee, no ceiling
            quota = self.quotas[tenant] = TenantQuota(tenant, 0, UNLIMITED_GPUS)
        return quota


@dataclass(slots=True)
class CycleState:
    # Milli-GPUs each tenant holds (stopping jobs included), and of that what runs guaranteed.
    held: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    guaranteed_held: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Running jobs already told to stop, and this cycle's victims.
    leaving: set[int] = field(default_factory=set)
    # The decisions so far.
    placements: list[Place] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    # Runs of ``pending`` told from a carried queue elsewhere than where it was last told: (where
    # the run starts, where among the verdicts of the cycle that last told them each was told
    # then; -1: never). ``Decisions.told_at``.
    told_at: list[tuple[int, list[int]]] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    promises: list[Promise] = field(default_factory=list)
    # Jobs settled before the borrowing pass (placed, reclaiming or waiting, by the guaranteed pass
    # or as the holders of a promise): the passes after skip them.
    handled: set[int] = field(default_factory=set)
    searches: int = 0  # placement searches made (bounded by config.max_placement_searches)
    reclaims: int = 0  # reclaim searches made (bounded by config.max_reclaims)
    # The one gang hold of the cycle: (job, node names, ETA) and the nodes held.
    holder: tuple[JobRequest, tuple[str, ...], float | None] | None = None
    reserved_nodes: list[NodeSlot] = field(default_factory=list)
    borrowing_tenants: set[str] = field(default_factory=set)  # tenants that borrowed this cycle (only grows)
    # Smallest guaranteed request in each tenant's queue: the guaranteed pass skips a tenant whose
    # remaining guarantee is smaller.
    smallest_guaranteed_ask: dict[str, int] = field(default_factory=dict)
    # Job arrays: jobs running (stopping ones too), their expected ends, and how many wait at the cap.
    array_running: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    array_ends: defaultdict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    array_blocked: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    # Bumped by every change to capacity (a placement) or to the hold: what ``Memo.now`` answers
    # were computed at.
    version: int = 0


class Memo:
    """The cycle's cached answers, under one rule:

    * an answer about the inventory or about a request (whether some node could ever hold it, a
      reason's wording) lasts the whole cycle (shapes and inventory reasons last longer: they are
      in ``carry.Carry``);
    * a failed search lasts too (``failed``): capacity only shrinks within a cycle, so a request
      needing at least as much as a failed one fails again;
    * an answer about what is free now (``now``) lasts until ``CycleState.version`` moves.
    """

    def __init__(self, reasons: InternedReasons | None = None):
        self.failed = FailureMemo()
        # Lasting (the reasons from cycle to cycle, when the carry's are handed in).
        self.reasons = InternedReasons() if reasons is None else reasons
        self.ceiling_waits: dict[tuple, dict] = {}  # (tenant, held) -> {need: (reason, eta)}
        self.start_shares: dict[str, float] = {}  # tenant -> weighted share before this cycle's placements
        self.lower_borrowing: dict[tuple, bool] = {}  # (tenant, borrowers this cycle) -> is one ahead of it borrowing
        self.timelines: dict = {}  # tenant -> ReleaseTimeline of its running jobs
        self.fits_one_node: dict = {}  # shape -> does some node have room for the whole gang
        self.fits_reserved: dict = {}  # (class, shape) -> would it fit on the held nodes
        self.not_on_reserved = FailureMemo()
        self.keys: dict[str, tuple] = {}  # tenant -> (the hold's backfill bound, its queue's memo keys)
        # Until the version moves.
        self._now: dict[tuple, object] = {}
        self._now_at = 0

    def reason(self, build, *args) -> PendingReason:
        """Reasons are frozen and many jobs share one: build each distinct sentence once (and
        hand out the same object in the cycles after, ``InternedReasons``)."""
        return self.reasons.get(build, *args)

    def now(self, version: int) -> dict[tuple, object]:
        """Answers about what is free, valid at ``version`` (emptied when it has moved)."""
        if version != self._now_at:
            self._now.clear()
            self._now_at = version
        return self._now
