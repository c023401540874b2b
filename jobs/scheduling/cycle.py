"""One scheduling cycle: ``decide(snapshot, now, config, carry=None) -> Decisions`` (``carry``: what the
caller's previous cycles left, ``carry.Carry``; the same decisions with or without it).

The order of work (Kueue-like: snapshot -> nominate -> order -> admit/preempt):

1. Opportunistic residents that squeeze a guaranteed job's memory are preempted.
2. Pending jobs are grouped per tenant, ordered by priority then submit time; requests that cannot
   run on this inventory at all get their reason straight away, and so do jobs waiting for jobs
   they depend on (they take no part in the passes: no reservation, no place in anyone's way).
3. **Guaranteed pass**, across tenants by priority then submit time: a job runs guaranteed while
   its tenant's guaranteed use plus the job stays within ``guaranteed_gpus`` (and its total within
   the ceiling). No room -> reclaim from borrowers (Preempt decisions; the job waits as
   RECLAIMING). No reclaim possible -> it waits, and the first such gang may hold a reservation.
4. **Borrowing pass**: everything else, tenant by tenant in weighted fair-share order (lowest
   (decayed usage + GPUs held) / weight first, re-ranked after every placement), never past a
   tenant's ``max_gpus``. Within a tenant, priority then submit time; a job that does not fit is
   skipped, not waited on (gangs are protected by the reservation instead).
5. Duty cycles of running opportunistic jobs move by AIMD from live utilisation.

In both passes a job of an array already running ``array_limit`` jobs (counting this cycle's
placements) waits with ``ARRAY_LIMIT`` before any search. A gang that fits on one node but finds
none with room, while a spread placement is possible, waits for one node until
``gang_single_node_wait_s`` after its submission (``WAITING_FOR_ONE_NODE``), then is spread; every
placement carries a ``note`` saying which choice was made and why.

Capacity only shrinks within a cycle, so a request shape that failed once fails again: failures
are memoised, which is what keeps 50,000 pending jobs cheap.
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict
from functools import partial
from operator import attrgetter

from jobs.scheduling import reasons
from jobs.scheduling.borrowing import Borrowing
from jobs.scheduling.capacity import Capacity
from jobs.scheduling.carry import (
    ALONE, UNLIMITED_GPUS, Carry, Entry, Outcome, QueueColumns, QueueReadings, TenantQueue, queue_order,
)
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.cycle_state import CycleState, Memo
from jobs.scheduling.decisions import Decisions, Pending, Place, Preempt, PreemptReason, new_pending
from jobs.scheduling.eta import QueueEta, ReleaseTimeline, releases_of
from jobs.scheduling.explain import InventoryCheck, invalid_request
from jobs.scheduling.fragmentation_score import FragmentationScore, snapshot_requests
from jobs.scheduling.placement import Choice, OneNodeWait, Placer, Shape, shape_of
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.reclaim import RECLAIM_LOOKAHEAD, Gang, Reclaimer, memory_pressure_victims
from jobs.scheduling.reservation import may_backfill
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobClass, JobRequest, Promise, TenantQuota
from jobs.scheduling.duty_cycles import throttles
from jobs.scheduling.topology import rendezvous_of, slices_of
from jobs.scheduling.turnover import Turnover
from jobs.scheduling.usage import weighted_share
from jobs.scheduling.user_limits import UserLimits
from jobs.scheduling.waiting import Waiting

def _request_key(job: JobRequest) -> tuple:
    """Everything about a request that placement looks at (equal keys share one Shape). Plain
    values only: comparing dataclasses on every dict hit would cost more than the rest."""
    profile = job.profile
    return (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
            job.allreduce_bytes, profile and profile.peak_memory_mib, profile and profile.mean_utilisation,
            job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile, job.accepts_unfenced)


def _queue_key(job: JobRequest) -> tuple:
    """Equal for two jobs of one tenant when ``Cycle._entries`` makes the same entry of both, bar
    the job itself, its dependencies and its expected runtime: the request key's fields (the
    recorded profile's two apart, after the rest) and whether the job may run guaranteed.
    (``_entries`` spells it out: it sees every pending job.)"""
    key = (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
           job.allreduce_bytes, job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile,
           job.accepts_unfenced, job.opportunistic_only)
    profile = job.profile
    return key if profile is None else (key, profile.peak_memory_mib, profile.mean_utilisation)


GUARANTEED, OPPORTUNISTIC = JobClass.GUARANTEED, JobClass.OPPORTUNISTIC


_by_id, _by_submitted_at, _by_priority = attrgetter("id"), attrgetter("submitted_at"), attrgetter("priority")


_guaranteed_count, _capacity_mib = attrgetter("guaranteed_count"), attrgetter("capacity_mib")


def _node_names(gpus) -> tuple[str, ...]:
    return tuple(sorted({gpu.node.name for gpu in gpus}))


def decide(snapshot: ClusterSnapshot, now: float, config: SchedulerConfig = SchedulerConfig(),
           carry: Carry | None = None) -> Decisions:
    """``carry``: what the caller's previous cycles left (``carry.Carry``); the same decisions with
    or without one, only sooner when the queue has not changed much."""
    # A cycle allocates ~10^5 short-lived objects next to a snapshot of ~10^5 long-lived ones; each
    # full collection the allocations trigger rescans the snapshot and roughly doubles the cycle
    # time. Pausing the collector for the cycle changes no result; it is switched back after.
    paused = config.pause_gc and gc.isenabled()
    if paused:
        gc.disable()
    try:
        cycle = Cycle(snapshot, now, config, carry)
        try:
            return cycle.run()
        finally:
            cycle.capacity.dismantle()
    finally:
        if paused:
            gc.enable()


class Cycle(Waiting, Borrowing):
    """One run of the passes. Fixed for the cycle: ``snapshot``, ``now``, ``config``, the capacity
    indexes, the placer, the inventory check, quotas, the reclaimer and the release timeline.
    What changes is in ``state`` (decisions so far, what each tenant holds, the hold); what is
    reused is in ``memo`` (see ``cycle_state.Memo`` for when each answer stops being true)."""

    def __init__(self, snapshot: ClusterSnapshot, now: float, config: SchedulerConfig, carry: Carry | None = None):
        self.snapshot, self.now, self.config = snapshot, now, config
        self.capacity = Capacity(snapshot, config)
        self.placer = Placer(self.capacity, config, FragmentationScore(snapshot_requests(snapshot))
                             if config.placement_score == "fgd" else None)
        self.inventory = InventoryCheck(self.capacity, self.placer)
        if carry is None:
            carry = Carry()  # (kept for this cycle only: nothing to check it against)
        else:
            carry.begin(config, self.capacity, self.inventory.reason)
        self.carry = carry
        self.quotas = {t.name: t for t in snapshot.tenants}
        self.state = state = CycleState(leaving={job.id for job in snapshot.running if job.preempting})
        self.memo = Memo()
        borrowed: dict[str, int] = defaultdict(int)
        for job in snapshot.running:
            quota_milli = job.quota_milli
            state.held[job.tenant] += quota_milli
            if job.job_class is GUARANTEED:
                state.guaranteed_held[job.tenant] += quota_milli
            if job.id not in state.leaving:
                borrowed[job.tenant] += quota_milli
            if job.array_id is not None:
                state.array_running[job.array_id] += 1
                if job.id not in state.leaving and job.expected_end is not None:
                    state.array_ends[job.array_id].append(max(now, job.expected_end))
        for tenant in borrowed:
            borrowed[tenant] -= self.quota(tenant).guaranteed_milli
        self.start_held = dict(state.held)
        self.borrowing_at_start = frozenset(job.tenant for job in snapshot.running
                                            if job.job_class is OPPORTUNISTIC and job.id not in state.leaving)
        self.reclaimer = Reclaimer(self.capacity, self.placer, config, now, borrowed, state.leaving)
        self.turnover = Turnover.of(self.capacity, self.placer, config, now, borrowed, state.leaving)
        # (kept for the tenants' own timelines, ``Waiting._tenant_timeline``: one sort for all)
        self.releases = releases_of(snapshot.running, now)
        leaving = state.leaving
        self.timeline = ReleaseTimeline((), now, [r for r in self.releases if r[3] not in leaving] if leaving
                                        else self.releases)
        self.queue_eta = QueueEta(self.timeline, sum(self.capacity.start_total_empty) * WHOLE_GPU_MILLI)
        self.users = UserLimits(snapshot, now)

    def quota(self, tenant: str) -> TenantQuota:
        quota = self.quotas.get(tenant)
        if quota is None:  # unknown tenant (simulator, tests): no guarantee, no ceiling
            quota = self.quotas[tenant] = TenantQuota(tenant, 0, UNLIMITED_GPUS)
        return quota

    def _shape_and_reason(self, job: JobRequest) -> tuple[Shape, PendingReason | None]:
        """A request's shape and, if it cannot run on this inventory at all, why (cached together:
        50,000 jobs come in a few thousand shapes)."""
        key = _request_key(job)
        found = self.carry.shapes.get(key)
        if found is None:
            shape, invalid = shape_of(job, self.config), invalid_request(job)
            found = self.carry.shapes[key] = (shape, invalid or self.inventory.reason(shape), invalid is not None)
        return found[0], found[1]

    # -- the cycle ---------------------------------------------------------------------------------

    def run(self) -> Decisions:
        for victim, gpu_id in memory_pressure_victims(self.capacity, self.config, self.state.leaving):
            self.state.preemptions.append(Preempt(victim.id, PreemptReason.MEMORY_PRESSURE,
                                            f"GPU {gpu_id} is short of memory for a guaranteed job"))
            self.reclaimer.borrowed[victim.tenant] -= victim.quota_milli
        queues = self._queues()
        if self.snapshot.promises:
            self._keep_promises(queues)
        self._guaranteed_pass(queues)
        self._borrowing_pass(queues)
        return Decisions(
            placements=tuple(self.state.placements), pending=tuple(self.state.pending), preemptions=tuple(self.state.preemptions),
            throttles=tuple(throttles(self.capacity, self.snapshot.running, self.snapshot.readings.jobs,
                                      self.state.leaving, self.config)),
            reservations=tuple(self.state.reservations), promises=tuple(self.state.promises),
        )

    def _queues(self) -> dict[str, list[Entry]]:
        by_tenant: dict[str, list[JobRequest]] = defaultdict(list)
        for job in self.snapshot.pending:
            by_tenant[job.tenant].append(job)
        queues: dict[str, list[Entry]] = {}
        kept, carried = self.carry.queues, {}
        for tenant in sorted(by_tenant):
            jobs, ceiling = by_tenant[tenant], self.quota(tenant).ceiling_milli
            # The same jobs (the very same objects, mostly: a list compare at C speed) under the
            # same ceiling make the same queue as last cycle.
            found = kept.get(tenant)
            if found is None or found.ceiling_milli != ceiling:
                found = self._tenant_queue(tenant, jobs, ceiling)
            elif found.jobs != jobs:
                found = (found.updated(jobs, partial(self._entries, tenant, ceiling))
                         or self._tenant_queue(tenant, jobs, ceiling))
            carried[tenant] = found
            queues[tenant] = found.queue
            self.state.pending.extend(found.waits)
            self.state.smallest_guaranteed_ask[tenant] = found.smallest_guaranteed_ask
        self.carry.queues = carried
        return queues

    def _tenant_queue(self, tenant: str, jobs: list[JobRequest], ceiling: int) -> TenantQueue:
        ordered = list(jobs)
        # Priority (high first), then submit time, then id: three C-level stable sorts on one
        # attribute each, the last key first (an int or float key compares in a few instructions,
        # a tuple key through generic rich comparisons, which cost more than the extra passes).
        ordered.sort(key=_by_id)
        ordered.sort(key=_by_submitted_at)
        ordered.sort(key=_by_priority, reverse=True)
        outcomes: dict = {}
        queue, waits, smallest, read = self._entries(tenant, ceiling, ordered, outcomes)
        made = TenantQueue(jobs, ceiling, queue, waits, smallest, outcomes)
        if made.shares_keys:  # (else the borrowing pass settles it one by one: no columns)
            made.columns = QueueColumns(queue, read)
            if read.keys is not None:  # (this cycle's first borrowing visit needs no keys made)
                made.columns.seed_keys(read.keys, read.young_gangs)
        return made

    def _entries(self, tenant: str, ceiling: int, ordered: list[JobRequest],
                 outcomes: dict) -> tuple[list[Entry], list[Pending], int, QueueReadings]:
        """The queue entries of ``ordered`` (jobs in queue order), the waits told before any pass,
        the smallest ask that may run guaranteed, and what ``QueueColumns`` reads of the entries'
        jobs (read here, with each job at hand), with each entry's memo key in a borrowing pass
        at this cycle's clock without a hold (``QueueColumns.keys``; None where a gang's submit
        time is not a number). ``outcomes``: the tenant queue's interned ``Outcome`` per (shape,
        opportunistic only), added to as needed."""
        queue: list[Entry] = []
        waits: list[Pending] = []
        smallest = UNLIMITED_GPUS
        # This loop sees every pending job, and a tenant's 500 jobs come in a few dozen requests:
        # what a job gets is worked out once per ``_queue_key`` and looked up after.
        kinds: dict[tuple, tuple] = {}
        append, append_wait = queue.append, waits.append
        ids, runtimes, arrays, gangs, gang_submitted, timed, keys = [], [], [], [], [], [], []
        append_id, append_runtime, append_gang, append_submitted, append_timed, append_key = (
            ids.append, runtimes.append, gangs.append, gang_submitted.append, timed.append, keys.append)
        now, one_node_wait, young, timeless = self.now, self.config.gang_single_node_wait_s, 0, False
        for job in ordered:
            # (``_queue_key`` inlined; attributes read in bytecode, not by an attrgetter: the
            # interpreter's specialised slot reads cost a fraction of an attrgetter's generic lookup)
            key = (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
                   job.allreduce_bytes, job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile,
                   job.accepts_unfenced, job.opportunistic_only)
            profile = job.profile
            if profile is not None:
                key = (key, profile.peak_memory_mib, profile.mean_utilisation)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = self._entry_kind(tenant, ceiling, job, outcomes)
            shape, reason, need, outcome, spread_gang, ask = kind
            if reason is not None:
                append_wait(new_pending((job.id, reason, None)))
            elif job.waiting_for:
                append_wait(new_pending((job.id, self._reason(reasons.waiting_for_dependency, job.waiting_for), None)))
            else:
                runtime = job.expected_runtime_s
                append((job, shape, need, outcome, spread_gang or runtime is not None))
                if runtime is not None and runtime == runtime:  # (NaN: never backfills, see QueueColumns)
                    append_timed(len(ids))
                # Its memo key as ``QueueColumns.keys`` makes it with no hold: a gang young enough
                # to wait for one node apart (``Cycle._young_gang``'s test), an array job alone.
                memo_key = outcome
                if spread_gang:
                    submitted = job.submitted_at
                    append_gang(len(ids))
                    append_submitted(submitted)
                    if now - submitted < one_node_wait:
                        memo_key = outcome.young_key or outcome.key(False, True)
                        young += 1
                    elif not now - submitted >= one_node_wait:
                        timeless = True  # (not a number: the columns' sorted bisection decides)
                if job.array_limit is not None:
                    arrays.append(len(ids))
                    memo_key = ALONE
                append_id(job.id)
                append_runtime(runtime)
                append_key(memo_key)
                if ask < smallest:
                    smallest = ask
        return queue, waits, smallest, QueueReadings(ids, runtimes, arrays, gang_submitted,
                                                     None if timeless else keys, young, gangs, timed)

    def _entry_kind(self, tenant: str, ceiling: int, job: JobRequest, outcomes: dict) -> tuple:
        """What ``_entries`` makes of every job of ``tenant`` with ``job``'s ``_queue_key``:
        (shape, the reason it waits before any pass or None, milli-GPUs it needs, its Outcome,
        whether it is a gang that may spread, the ask it adds to the smallest guaranteed one)."""
        need = job.gpus * job.gpu_milli
        if need > ceiling and job.gpu_milli <= WHOLE_GPU_MILLI:  # more than the tenant may ever hold: say so first
            return None, self._reason(reasons.over_max_gpus, tenant, ceiling, need), need, None, False, UNLIMITED_GPUS
        shape, reason = self._shape_and_reason(job)
        if reason is not None:
            return shape, reason, need, None, False, UNLIMITED_GPUS
        opportunistic_only = job.opportunistic_only
        outcome = outcomes.get((shape, opportunistic_only))
        if outcome is None:
            outcome = outcomes[shape, opportunistic_only] = Outcome(tenant, shape, opportunistic_only)
        return (shape, None, need, outcome, outcome.spread_gang,
                UNLIMITED_GPUS if opportunistic_only else need)

    def _keep_promises(self, queues: dict[str, list[Entry]]) -> None:
        """Jobs that reclaimed GPUs in an earlier cycle come first, onto exactly those GPUs: their
        victims were chosen for them, and another guaranteed job placed there by best fit would
        leave them to reclaim again (more borrowed work lost). While a job's victims are still
        stopping, its GPUs stay promised and nobody else may take them, but the job itself starts
        elsewhere if it can. A promise yields to guaranteed work of its tenant queued since at a
        higher priority that the guarantee cannot hold beside it, and lapses when it no longer
        holds (a GPU gone, taken or on a node lost or cordoned since, the job past its guarantee or
        at its array's or its user's limit): the passes then treat the job like any other."""
        wanted = {promise.job_id: promise for promise in self.snapshot.promises}
        found: list[tuple[Entry, int]] = []  # with the guaranteed milli-GPUs of higher priority ahead
        for tenant in sorted({promise.tenant for promise in wanted.values()}):
            room, higher, level, level_priority = self._guaranteed_room(tenant), 0, 0, None
            for entry in queues.get(tenant, ()):  # (by priority, high first)
                job, need = entry[0], entry[2]
                if job.priority != level_priority:
                    higher, level, level_priority = higher + level, 0, job.priority
                if job.id in wanted:
                    found.append((entry, higher))
                elif not job.opportunistic_only and need <= room:
                    level += need
        found.sort(key=lambda item: queue_order(item[0][0]))
        by_id, stopping = self.capacity.by_id, []
        for (job, shape, need, _, _), ahead in found:
            if job.array_limit is not None and self._array_full(job) or self.users.at_limit(job):
                continue  # (the passes say why, and count its place in line)
            room = self._guaranteed_room(job.tenant)
            if not job.opportunistic_only and need + ahead <= room:
                job_class = GUARANTEED
            elif ((job.opportunistic_only or need > room) and self.turnover is not None
                  and need <= self.quota(job.tenant).ceiling_milli - self.state.held[job.tenant]):
                job_class = OPPORTUNISTIC  # a borrower's turnover (``turnover``)
            else:
                continue
            promise = wanted[job.id]
            gpus = [by_id.get(gpu_id) for gpu_id in promise.gpu_ids]
            if None in gpus:
                continue
            choice = self.placer.on_gpus(gpus, shape, job_class)
            if choice is not None:
                self._place(job, shape, job_class, choice)
            elif self.reclaimer.frees(gpus, shape):
                stopping.append((job, shape, promise, gpus, job_class))
        for *_, gpus, _ in stopping:  # (all of them first: no job may start on another's)
            for gpu in gpus:
                self.capacity.block(gpu)
        for job, shape, promise, gpus, job_class in stopping:
            choice = self._find(job, shape, job_class)
            if isinstance(choice, Choice):
                self._place(job, shape, job_class, choice)
                continue
            self.state.handled.add(job.id)
            self.state.promises.append(promise)
            self._count(job, job_class)
            self._wait(job, reasons.reclaiming(job.gpus, 0, _node_names(gpus)) if job_class is GUARANTEED
                       else reasons.turning_over(job.gpus, 0, _node_names(gpus)), eta=0.0)

    def _guaranteed_room(self, tenant: str) -> int:
        """Milli-GPUs the tenant may still start as guaranteed work."""
        quota = self.quota(tenant)
        return min(quota.guaranteed_milli - self.state.guaranteed_held[tenant], quota.ceiling_milli - self.state.held[tenant])

    def _guaranteed_pass(self, queues: dict[str, list[Entry]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap: list[tuple] = []
        handled = self.state.handled  # (jobs that kept a promise already are)

        def push_next(tenant: str) -> None:
            queue = queues[tenant]
            room = self._guaranteed_room(tenant)
            if room < self.state.smallest_guaranteed_ask[tenant]:
                return  # nothing left in this queue fits what is left of the guarantee
            position = cursors[tenant]
            while position < len(queue):
                job, shape, need, _, _ = queue[position]
                position += 1
                if not job.opportunistic_only and need <= room and job.id not in handled:
                    heapq.heappush(heap, (-job.priority, job.submitted_at, job.id, tenant, job, shape))
                    break
            cursors[tenant] = position

        for tenant in queues:
            push_next(tenant)
        while heap:
            *_, tenant, job, shape = heapq.heappop(heap)
            if self.state.searches >= self.config.max_placement_searches:
                break
            self.state.handled.add(job.id)  # placed, reclaiming or waiting: the borrowing pass skips it
            if job.array_limit is not None and self._array_full(job):
                self._wait_for_array(job)
            elif (capped := self.users.why_waiting(job)) is not None:
                self._wait(job, *capped)
            else:
                self._admit_guaranteed(job, shape, lambda t=tenant: queues[t][cursors[t]:cursors[t] + RECLAIM_LOOKAHEAD])
            push_next(tenant)

    def _admit_guaranteed(self, job: JobRequest, shape: Shape, behind=None) -> None:
        """Place the job, else reclaim for it, else say why it waits. ``behind``: the tenant's
        queue entries after it (made only for a reclaim), whose gangs a reclaim keeps room for."""
        choice = self._find(job, shape, GUARANTEED)
        if isinstance(choice, OneNodeWait):
            self._wait_for_one_node(job, choice)
            return
        if choice is not None:
            self._place(job, shape, GUARANTEED, choice)
            return
        reclaim = None
        if self.state.reclaims < self.config.max_reclaims and not self.memo.failed.fails("reclaim", shape):
            self.state.reclaims += 1
            reclaim = self.reclaimer.find(job.id, shape, self._gangs_behind(job, behind()) if behind else None)
            if reclaim is None:
                self.memo.failed.record("reclaim", shape)
        if reclaim is not None:
            for victim in reclaim.victims:
                self.state.preemptions.append(Preempt(
                    victim.id, PreemptReason.RECLAIM_FOR_GUARANTEE,
                    f"Tenant {job.tenant} needs its guaranteed GPUs back for job {job.id}", for_job_id=job.id))
            self.state.promises.append(Promise(job.id, job.tenant, tuple(gpu.id for gpu in reclaim.gpus)))
            self._count(job, GUARANTEED)
            self._wait(job, reasons.reclaiming(job.gpus, len(reclaim.victims), _node_names(reclaim.gpus)), eta=0.0)
            return
        self._blocked(job, shape, GUARANTEED)

    def _gangs_behind(self, job: JobRequest, entries: list[Entry]) -> list[Gang]:
        """The gangs among the first ``RECLAIM_LOOKAHEAD`` of ``entries`` (the tenant's queue after
        ``job``) that could run next: the tenant's guarantee holds them once ``job`` and the jobs
        queued between them run, and so do their user's and array's limits (counting those jobs)."""
        room = self._guaranteed_room(job.tenant) - job.gpus * job.gpu_milli
        gangs: list[Gang] = []
        handled = self.state.handled
        # What ``job`` and the entries counted so far will hold, per user and per array.
        users: dict[str, list[int]] = {job.user: [1, job.quota_milli]}
        arrays: dict[int, int] = {job.array_id: 1} if job.array_id is not None else {}
        for queued, shape, need, _, _ in entries[:RECLAIM_LOOKAHEAD]:
            if room <= 0:
                break
            if queued.opportunistic_only or need > room or queued.id in handled:
                continue
            array = queued.array_id
            if queued.array_limit is not None and self._array_full(queued, arrays.get(array, 0)):
                continue
            more = users.get(queued.user, (0, 0))
            if self.users.at_limit(queued, more[0], more[1]):
                continue
            room -= need
            held = users.setdefault(queued.user, [0, 0])
            held[0] += 1
            held[1] += queued.quota_milli
            if array is not None:
                arrays[array] = arrays.get(array, 0) + 1
            if queued.gpus > 1:
                gangs.append(Gang(queued.gpus, tuple(self.placer.pools_for(shape)), shape.max_nodes != 1))
        return gangs

    # -- outcomes ----------------------------------------------------------------------------------

    def _find(self, job: JobRequest, shape: Shape, job_class: JobClass) -> Choice | OneNodeWait | None:
        backfill = self.state.holder is not None and may_backfill(job, self.state.holder[2])
        tag = (job_class, backfill)
        if self.memo.failed.fails(tag, shape):
            return None
        held = self.state.reserved_nodes if backfill else []
        if self._young_gang(job, shape) and self._fits_one_node(shape):
            one_node = ("one node", job_class, backfill)
            if not self.memo.failed.fails(one_node, shape):
                self.state.searches += 1
                choice = self.placer.find(shape, job_class, held, spread=False)
                if choice is not None:
                    return choice
                self.memo.failed.record(one_node, shape)
            # Whether a spread is possible only changes with a placement: gangs of one shape share the answer.
            known = self.memo.now(self.state.version)
            if ("spread", shape, tag) not in known:
                self.state.searches += 1
                choice = self.placer.find(shape, job_class, held)
                known["spread", shape, tag] = None if choice is None else len(choice.slices)
            spread_nodes = known["spread", shape, tag]
            if spread_nodes is None:
                self.memo.failed.record(tag, shape)
                return None
            return OneNodeWait(spread_nodes)
        self.state.searches += 1
        choice = self.placer.find(shape, job_class, held)
        if choice is None:
            self.memo.failed.record(tag, shape)
        return choice

    def _young_gang(self, job: JobRequest, shape: Shape) -> bool:
        """A gang still within its wait for one node (whether one could ever hold it aside)."""
        return (job.gpus > 1 and shape.max_nodes != 1
                and self.now - job.submitted_at < self.config.gang_single_node_wait_s)

    def _fits_one_node(self, shape: Shape) -> bool:
        """Does some schedulable node have enough GPUs of one model for the whole gang?"""
        fits = self.memo.fits_one_node.get(shape)
        if fits is None:
            fits = self.memo.fits_one_node[shape] = any(
                widths and widths[0] >= shape.gpus
                for widths in map(self.inventory.node_widths, self.placer.pools_by_model(self.placer.pools_for(shape))))
        return fits

    def _place(self, job: JobRequest, shape: Shape, job_class: JobClass, choice: Choice) -> None:
        gpus = [gpu for _, node_gpus in choice.slices for gpu in node_gpus]
        next_to_guarantee = any(map(_guaranteed_count, gpus))
        self.capacity.take(gpus, job_class, choice.memory_mib, shape.demand_milli, shape.gpu_milli, shape.shareable,
                           shape.cpu_per_gpu, shape.host_mb_per_gpu, shape.accepts_unfenced, shape.headroom_mib)
        self._count(job, job_class)
        biggest = max(choice.memory_mib)
        capacity = min(map(_capacity_mib, gpus))
        protected = job_class is GUARANTEED and not shape.shareable
        limit = None if protected or biggest >= capacity else min(capacity, biggest + shape.headroom_mib)
        duty = self.config.shared_start_duty_cycle if job_class is OPPORTUNISTIC and next_to_guarantee else 1.0
        slices = slices_of(choice.slices)
        self.state.placements.append(Place(
            job_id=job.id, slices=slices, job_class=job_class, memory_limit_mib=limit, gpu_milli=job.gpu_milli,
            duty_cycle=duty, allreduce_s=choice.allreduce_s, rendezvous=rendezvous_of(job.id, slices, self.config),
            note=self._note(job, shape, slices, gpus)))
        self.state.handled.add(job.id)
        self.state.version += 1
        self.users.placed(job)
        if job.array_id is not None:
            self.state.array_running[job.array_id] += 1
            if job.expected_runtime_s is not None:
                self.state.array_ends[job.array_id].append(self.now + job.expected_runtime_s)

    def _note(self, job: JobRequest, shape: Shape, slices, gpus) -> str:
        """One sentence for the job's timeline: where it went and why there."""
        if len(slices) == 1:
            if job.gpus > 1:
                return f"On one node ({slices[0].node})."
            others = gpus[0].occupants - 1  # (already counts this job)
            if others:
                return (f"On {slices[0].node}, GPU {slices[0].gpu_indices[0]}, sharing it with "
                        f"{others} running job{'s' if others != 1 else ''}.")
            return f"On {slices[0].node}, GPU {slices[0].gpu_indices[0]}."
        names = ", ".join(s.node for s in slices)
        spread = f"Spread over {len(slices)} nodes ({names})"
        if not self._fits_one_node(shape):
            return f"{spread}: no node has {job.gpus} GPUs of one model that fit it."
        if self.config.gang_single_node_wait_s <= 0:
            return f"{spread}: no node had {job.gpus} free GPUs (waiting for one node is switched off)."
        return (f"{spread} after waiting {reasons.duration(self.now - job.submitted_at)} for one node "
                f"with {job.gpus} free GPUs.")

    def _array_full(self, job: JobRequest, more: int = 0) -> bool:
        """Is ``job``'s array at its limit (with ``more`` of its jobs about to run)?"""
        return self.state.array_running[job.array_id] + more >= job.array_limit

    def _wait_for_array(self, job: JobRequest) -> None:
        array, limit = job.array_id, job.array_limit
        running = self.state.array_running[array]
        # The i-th waiting job of the array starts once (running - limit + i + 1) of its jobs ended.
        position = running - limit + self.state.array_blocked[array]
        self.state.array_blocked[array] += 1
        ends = self.state.array_ends.get(array)
        eta = None
        if ends and position < len(ends):
            ends.sort()
            eta = max(0.0, ends[position] - self.now)
        self._wait(job, self._reason(reasons.array_limit, array, running, limit), eta)

    def _wait_for_one_node(self, job: JobRequest, wait: OneNodeWait) -> None:
        bound = self.config.gang_single_node_wait_s
        reason = self._reason(reasons.waiting_for_one_node, job.gpus, wait.spread_nodes, bound)
        # At the latest it is spread then (if the spread is still possible).
        self._wait(job, reason, max(0.0, job.submitted_at + bound - self.now))

    def _count(self, job: JobRequest, job_class: JobClass) -> None:
        self.state.held[job.tenant] += job.quota_milli
        if job_class is GUARANTEED:
            self.state.guaranteed_held[job.tenant] += job.quota_milli

    def _wait(self, job: JobRequest, reason: PendingReason, eta: float | None = None) -> None:
        self.state.pending.append(new_pending((job.id, reason, eta)))

    def _share(self, tenant: str) -> float:
        quota = self.quota(tenant)
        return weighted_share(quota.decayed_usage, self.state.held[tenant], quota.weight, self.config.usage_half_life_s)
