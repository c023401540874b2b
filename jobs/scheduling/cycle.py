"""One scheduling cycle: ``decide(snapshot, now, config) -> Decisions``.

The order of work (Kueue-like: snapshot -> nominate -> order -> admit/preempt):

1. Opportunistic residents that squeeze a guaranteed job's memory are preempted.
2. Pending jobs are grouped per tenant, ordered by priority then submit time; requests that cannot
   run on this inventory at all get their reason straight away.
3. **Guaranteed pass**, across tenants by priority then submit time: a job runs guaranteed while
   its tenant's guaranteed use plus the job stays within ``guaranteed_gpus`` (and its total within
   the ceiling). No room -> reclaim from borrowers (Preempt decisions; the job waits as
   RECLAIMING). No reclaim possible -> it waits, and the first such gang may hold a reservation.
4. **Borrowing pass**: everything else, tenant by tenant in weighted fair-share order (lowest
   (decayed usage + GPUs held) / weight first, re-ranked after every placement), never past a
   tenant's ``max_gpus``. Within a tenant, priority then submit time; a job that does not fit is
   skipped, not waited on (gangs are protected by the reservation instead).
5. Duty cycles of running opportunistic jobs move by AIMD from live utilisation.

Capacity only shrinks within a cycle, so a request shape that failed once fails again: failures
are memoised, which is what keeps 50,000 pending jobs cheap.
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict
from operator import attrgetter

from jobs.scheduling import reasons
from jobs.scheduling.capacity import Capacity, NodeSlot
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Decisions, Pending, Place, Preempt, PreemptReason, Reservation
from jobs.scheduling.eta import QueueEta, ReleaseTimeline
from jobs.scheduling.explain import InventoryCheck, invalid_request
from jobs.scheduling.placement import Choice, FailureMemo, Placer, Shape, shape_of
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.reclaim import Reclaimer, memory_pressure_victims
from jobs.scheduling.reservation import choose_nodes as reservation_nodes
from jobs.scheduling.reservation import may_backfill, window
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobClass, JobRequest, TenantQuota
from jobs.scheduling.throttle import throttles
from jobs.scheduling.topology import rendezvous_of, slices_of
from jobs.scheduling.usage import weighted_share

UNLIMITED_GPUS = 10**9
# Everything about a request that placement looks at (equal keys share one Shape).
_request_key = attrgetter("gpus", "gpu_milli", "gpu_memory_mib", "gpu_models", "max_nodes", "shareable",
                          "allreduce_bytes", "profile")
GUARANTEED, OPPORTUNISTIC = JobClass.GUARANTEED, JobClass.OPPORTUNISTIC


def decide(snapshot: ClusterSnapshot, now: float, config: SchedulerConfig = SchedulerConfig()) -> Decisions:
    # A cycle allocates ~10^5 short-lived objects next to a snapshot of ~10^5 long-lived ones; each
    # full collection the allocations trigger rescans the snapshot and roughly doubles the cycle
    # time. Pausing the collector for the cycle changes no result; it is switched back after.
    paused = config.pause_gc and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return Cycle(snapshot, now, config).run()
    finally:
        if paused:
            gc.enable()


class Cycle:
    def __init__(self, snapshot: ClusterSnapshot, now: float, config: SchedulerConfig):
        self.snapshot, self.now, self.config = snapshot, now, config
        self.capacity = Capacity(snapshot, config)
        self.placer = Placer(self.capacity, config)
        self.inventory = InventoryCheck(self.capacity, self.placer)
        self.quotas = {t.name: t for t in snapshot.tenants}
        self.leaving = {job.id for job in snapshot.running if job.preempting}
        self.held: dict[str, int] = defaultdict(int)  # milli-GPUs held, stopping jobs included
        self.guaranteed_held: dict[str, int] = defaultdict(int)
        borrowed: dict[str, int] = defaultdict(int)
        for job in snapshot.running:
            self.held[job.tenant] += job.quota_milli
            if job.job_class is GUARANTEED:
                self.guaranteed_held[job.tenant] += job.quota_milli
            if job.id not in self.leaving:
                borrowed[job.tenant] += job.quota_milli
        for tenant in borrowed:
            borrowed[tenant] -= self.quota(tenant).guaranteed_milli
        self.reclaimer = Reclaimer(self.capacity, self.placer, config, now, borrowed, self.leaving)
        self.timeline = ReleaseTimeline([j for j in snapshot.running if j.id not in self.leaving], now)
        self.queue_eta = QueueEta(self.timeline, sum(self.capacity.start_total_empty) * WHOLE_GPU_MILLI)
        self.placements: list[Place] = []
        self.pending: list[Pending] = []
        self.preemptions: list[Preempt] = []
        self.reservations: list[Reservation] = []
        self.handled: set[int] = set()  # jobs the guaranteed pass dealt with
        self.version = 0  # bumped whenever capacity or the hold changes
        self._outcomes: dict[tuple, PendingReason] = {}  # borrowing reasons, valid for one version
        self._outcomes_for: tuple[str, int] | None = None
        self.failed = FailureMemo()
        self.searches = 0
        self.reclaims = 0
        self.holder: tuple[JobRequest, tuple[str, ...], float | None] | None = None
        self.reserved_nodes: list[NodeSlot] = []
        self.borrowing_tenants: set[str] = set()  # tenants that borrowed this cycle
        self._shapes: dict[tuple, tuple[Shape, PendingReason | None]] = {}
        self._ceiling_waits: dict[tuple, tuple[PendingReason, float | None]] = {}
        self._started_room: dict[Shape, bool] = {}
        self._timelines: dict[str, ReleaseTimeline] = {}
        self._reasons: dict[tuple, PendingReason] = {}
        self._fits_reserved_memo: dict[tuple, bool] = {}

    def quota(self, tenant: str) -> TenantQuota:
        quota = self.quotas.get(tenant)
        if quota is None:  # unknown tenant (simulator, tests): no guarantee, no ceiling
            quota = self.quotas[tenant] = TenantQuota(tenant, 0, UNLIMITED_GPUS)
        return quota

    def _shape_and_reason(self, job: JobRequest) -> tuple[Shape, PendingReason | None]:
        """A request's shape and, if it cannot run on this inventory at all, why (cached together:
        50,000 jobs come in a few thousand shapes)."""
        key = _request_key(job)
        found = self._shapes.get(key)
        if found is None:
            shape = shape_of(job, self.config)
            found = self._shapes[key] = (shape, invalid_request(job) or self.inventory.reason(shape))
        return found

    # -- the cycle ---------------------------------------------------------------------------------

    def run(self) -> Decisions:
        for victim, gpu_id in memory_pressure_victims(self.capacity, self.config, self.leaving):
            self.preemptions.append(Preempt(victim.id, PreemptReason.MEMORY_PRESSURE,
                                            f"GPU {gpu_id} is short of memory for a guaranteed job"))
            self.reclaimer.borrowed[victim.tenant] -= victim.quota_milli
        queues = self._queues()
        self._guaranteed_pass(queues)
        self._borrowing_pass(queues)
        return Decisions(
            placements=tuple(self.placements), pending=tuple(self.pending), preemptions=tuple(self.preemptions),
            throttles=tuple(throttles(self.capacity, self.snapshot.running, self.leaving, self.config)),
            reservations=tuple(self.reservations),
        )

    def _queues(self) -> dict[str, list[tuple[JobRequest, Shape]]]:
        by_tenant: dict[str, list[JobRequest]] = defaultdict(list)
        for job in self.snapshot.pending:
            by_tenant[job.tenant].append(job)
        queues: dict[str, list[tuple[JobRequest, Shape]]] = {}
        for tenant in sorted(by_tenant):
            jobs = by_tenant[tenant]
            # Priority (high first), then submit time, then id: two C-level stable sorts.
            jobs.sort(key=attrgetter("submitted_at", "id"))
            jobs.sort(key=attrgetter("priority"), reverse=True)
            queue = queues[tenant] = []
            for job in jobs:
                shape, reason = self._shape_and_reason(job)
                if reason is None:
                    queue.append((job, shape))
                else:
                    self._wait(job, reason)
        return queues

    def _guaranteed_pass(self, queues: dict[str, list[tuple[JobRequest, Shape]]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap: list[tuple] = []

        def push_next(tenant: str) -> None:
            quota, queue = self.quota(tenant), queues[tenant]
            room = min(quota.guaranteed_milli - self.guaranteed_held[tenant], quota.ceiling_milli - self.held[tenant])
            position = cursors[tenant]
            while room > 0 and position < len(queue):
                job, shape = queue[position]
                position += 1
                if not job.opportunistic_only and job.quota_milli <= room:
                    heapq.heappush(heap, (-job.priority, job.submitted_at, job.id, tenant, job, shape))
                    break
            cursors[tenant] = position

        for tenant in queues:
            push_next(tenant)
        while heap:
            *_, tenant, job, shape = heapq.heappop(heap)
            if self.searches >= self.config.max_placement_searches:
                break
            self.handled.add(job.id)  # placed, reclaiming or waiting: the borrowing pass skips it
            self._admit_guaranteed(job, shape)
            push_next(tenant)

    def _admit_guaranteed(self, job: JobRequest, shape: Shape) -> None:
        choice = self._find(job, shape, GUARANTEED)
        if choice is not None:
            self._place(job, shape, GUARANTEED, choice)
            return
        reclaim = None
        if self.reclaims < self.config.max_reclaims and not self.failed.fails("reclaim", shape):
            self.reclaims += 1
            reclaim = self.reclaimer.find(job.id, shape)
            if reclaim is None:
                self.failed.record("reclaim", shape)
        if reclaim is not None:
            for victim in reclaim.victims:
                self.preemptions.append(Preempt(
                    victim.id, PreemptReason.RECLAIM_FOR_GUARANTEE,
                    f"Tenant {job.tenant} needs its guaranteed GPUs back for job {job.id}", for_job_id=job.id))
            self._count(job, GUARANTEED)
            self._wait(job, reasons.reclaiming(job.gpus, len(reclaim.victims)), eta=0.0)
            return
        self._blocked(job, shape, GUARANTEED)

    def _borrowing_pass(self, queues: dict[str, list[tuple[JobRequest, Shape]]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap = [(self._share(t), t) for t in queues]
        heapq.heapify(heap)
        handled, held, limit = self.handled, self.held, self.config.max_placement_searches
        while heap:
            share, tenant = heapq.heappop(heap)
            queue, quota = queues[tenant], self.quota(tenant)
            ceiling = quota.ceiling_milli
            position, end = cursors[tenant], len(queue)
            if held[tenant] >= ceiling:  # at the ceiling: nothing more of this tenant can run
                self._all_at_ceiling(queue[position:], quota)
                continue
            placed = False
            while position < end and not placed:
                job, shape = queue[position]
                position += 1
                if job.id in handled:
                    continue
                if held[tenant] + job.gpus * job.gpu_milli > ceiling:
                    self._all_at_ceiling([(job, shape)], quota)
                elif self.searches >= limit:
                    self._wait(job, self._reason(reasons.not_considered, limit))
                else:
                    placed = self._admit_borrowing(job, shape, share)
            cursors[tenant] = position
            if position < end:
                heapq.heappush(heap, (self._share(tenant), tenant))

    def _all_at_ceiling(self, entries: list[tuple[JobRequest, Shape]], quota: TenantQuota) -> None:
        held = self.held[quota.name]
        for job, _ in entries:
            if job.id in self.handled:
                continue
            key = (quota.name, held, job.gpus * job.gpu_milli)
            found = self._ceiling_waits.get(key)
            if found is None:
                need = job.gpus * job.gpu_milli
                eta = self._tenant_timeline(quota.name).eta(held + need - quota.ceiling_milli)
                found = self._ceiling_waits[key] = (reasons.at_max_gpus(quota.name, held, quota.ceiling_milli, need), eta)
            self.pending.append(Pending(job.id, *found))

    def _admit_borrowing(self, job: JobRequest, shape: Shape, share: float) -> bool:
        # Until something changes (a placement, a hold), a tenant's requests of one shape get the
        # same answer: most of 50,000 pending jobs are settled by this lookup.
        if self._outcomes_for != (job.tenant, self.version):
            self._outcomes.clear()
            self._outcomes_for = (job.tenant, self.version)
        backfill = self.holder is not None and may_backfill(job, self.holder[2])
        key = (shape, job.opportunistic_only, backfill)
        reason = self._outcomes.get(key)
        if reason is not None:
            self._wait(job, reason, self.queue_eta.next(job.gpus * job.gpu_milli))
            return False
        choice = self._find(job, shape, OPPORTUNISTIC)
        if choice is not None:
            self._place(job, shape, OPPORTUNISTIC, choice)
            self.borrowing_tenants.add(job.tenant)
            return True
        reason = self._blocked(job, shape, OPPORTUNISTIC, share)
        if self._outcomes_for == (job.tenant, self.version):  # no hold was taken meanwhile
            self._outcomes[key] = reason
        return False

    # -- outcomes ----------------------------------------------------------------------------------

    def _find(self, job: JobRequest, shape: Shape, job_class: JobClass) -> Choice | None:
        backfill = self.holder is not None and may_backfill(job, self.holder[2])
        tag = (job_class, backfill)
        if self.failed.fails(tag, shape):
            return None
        self.searches += 1
        choice = self.placer.find(shape, job_class, self.reserved_nodes if backfill else [])
        if choice is None:
            self.failed.record(tag, shape)
        return choice

    def _place(self, job: JobRequest, shape: Shape, job_class: JobClass, choice: Choice) -> None:
        gpus = [gpu for _, node_gpus in choice.slices for gpu in node_gpus]
        next_to_guarantee = any(gpu.guaranteed_count for gpu in gpus)
        self.capacity.take(gpus, job_class, choice.memory_mib, shape.demand_milli, shape.gpu_milli, shape.shareable)
        self._count(job, job_class)
        biggest = max(choice.memory_mib)
        capacity = min(gpu.capacity_mib for gpu in gpus)
        protected = job_class is GUARANTEED and not shape.shareable
        limit = None if protected or biggest >= capacity else min(capacity, biggest + self.config.share_memory_headroom_mib)
        duty = self.config.shared_start_duty_cycle if job_class is OPPORTUNISTIC and next_to_guarantee else 1.0
        slices = slices_of(choice.slices)
        self.placements.append(Place(
            job_id=job.id, slices=slices, job_class=job_class, memory_limit_mib=limit, gpu_milli=job.gpu_milli,
            duty_cycle=duty, allreduce_s=choice.allreduce_s, rendezvous=rendezvous_of(job.id, slices, self.config)))
        self.handled.add(job.id)

    def _count(self, job: JobRequest, job_class: JobClass) -> None:
        self.held[job.tenant] += job.quota_milli
        if job_class is GUARANTEED:
            self.guaranteed_held[job.tenant] += job.quota_milli

    def _wait(self, job: JobRequest, reason: PendingReason, eta: float | None = None) -> None:
        self.pending.append(Pending(job.id, reason, eta))

    def _share(self, tenant: str) -> float:
        quota = self.quota(tenant)
        return weighted_share(quota.decayed_usage, self.held[tenant], quota.weight, self.config.usage_half_life_s)

    def _tenant_timeline(self, tenant: str) -> ReleaseTimeline:
        if not self._timelines:
            by_tenant: dict[str, list] = defaultdict(list)
            for job in self.snapshot.running:
                if job.id not in self.leaving:
                    by_tenant[job.tenant].append(job)
            self._timelines = {t: ReleaseTimeline(jobs, self.now) for t, jobs in by_tenant.items()}
        if tenant not in self._timelines:
            self._timelines[tenant] = ReleaseTimeline([], self.now)
        return self._timelines[tenant]

    def _reason(self, build, *args) -> PendingReason:
        """Reasons are frozen and many jobs share one: build each distinct sentence once."""
        key = (build, *args)
        reason = self._reasons.get(key)
        if reason is None:
            reason = self._reasons[key] = build(*args)
        return reason

    def _blocked(self, job: JobRequest, shape: Shape, job_class: JobClass, share: float = 0.0) -> PendingReason:
        """A job that fits the inventory and its quota found no GPUs: say why, maybe reserve."""
        if self.holder is None and job.gpus > 1 and (held := self._hold(job, shape)) is not None:
            return held
        if self.holder is not None and self._fits_reserved(shape, job_class):
            holder, nodes, _ = self.holder
            reason = self._reason(reasons.reserved_for_gang, holder.id, holder.gpus, nodes)
        elif job_class is GUARANTEED:
            most_free = self.capacity.most_free_on_a_node(self.placer.pools_for(shape))
            reason = self._reason(reasons.waiting_for_free_gpus, job.gpus, shape.memory_mib, shape.max_nodes == 1,
                                  most_free)
        elif job.opportunistic_only and self.held[job.tenant] + job.quota_milli <= self.quota(job.tenant).guaranteed_milli:
            reason = self._reason(reasons.no_spare_capacity, job.gpus)
        elif (ahead := len(self.borrowing_tenants) - (job.tenant in self.borrowing_tenants)) and self._fitted_at_start(shape):
            reason = self._reason(reasons.behind_lower_usage, job.tenant, share, ahead)
        else:
            quota = self.quota(job.tenant)
            unused = quota.guaranteed_milli - self.guaranteed_held[job.tenant]
            reason = self._reason(reasons.over_quota_cluster_full, job.tenant, quota.guaranteed_milli, unused, job.gpus)
        self._wait(job, reason, self.queue_eta.next(job.quota_milli))
        return reason

    def _hold(self, job: JobRequest, shape: Shape) -> PendingReason | None:
        span = window(job, self.now, self.config.gang_reservation_max_s)
        if span is None or self.failed.fails("hold", shape):
            return None
        found = reservation_nodes(self.capacity, self.placer, shape, self.now, self.leaving)
        if found is None:
            self.failed.record("hold", shape)
            return None
        nodes, eta = found
        for node in nodes:
            self.capacity.reserve(node)
        names = tuple(node.name for node in nodes)
        self.reserved_nodes = nodes
        self.holder = (job, names, eta)
        self.version += 1
        self.reservations.append(Reservation(job.id, names, since=span[0], until=span[1], eta_s=eta))
        reason = reasons.holding_reservation(job.gpus, names, span[1], self.now)
        self._wait(job, reason, eta)
        return reason

    def _fits_reserved(self, shape: Shape, job_class: JobClass) -> bool:
        """Would the job fit on the held nodes? (then the hold is what keeps it waiting)"""
        key = (job_class, shape)
        fits = self._fits_reserved_memo.get(key)
        if fits is None:
            fits = self._fits_reserved_memo[key] = self.placer.fits_on(self.reserved_nodes, shape, job_class)
        return fits

    def _fitted_at_start(self, shape: Shape) -> bool:
        """Would the request have found room before this cycle's placements? (an estimate)"""
        if shape not in self._started_room:
            self._started_room[shape] = self._room_at_start(shape)
        return self._started_room[shape]

    def _room_at_start(self, shape: Shape) -> bool:
        pools = self.placer.pools_for(shape)
        capacity = self.capacity
        if any(capacity.start_max_empty[p] >= shape.gpus for p in pools):
            return True
        if shape.gpus > 1:
            return shape.max_nodes != 1 and sum(capacity.start_total_empty[p] for p in pools) >= shape.gpus
        headroom = self.config.share_memory_headroom_mib
        return any(capacity.start_max_opp_free[p] >= shape.memory_on(capacity.pools[p][1]) + headroom for p in pools)
