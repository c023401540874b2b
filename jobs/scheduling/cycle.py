"""One scheduling cycle: ``decide(snapshot, now, config, carry=None) -> Decisions``: the policy, as
steps in order. ``carry``: what the caller's previous cycles left (``carry.Carry``); the same
decisions with or without it, only sooner when the queue has not changed much.

Which GPU does a job get? Step by step:

1. **Memory pressure** (``reclaim.memory_pressure_victims``): opportunistic residents that squeeze
   a guaranteed job's GPU memory are preempted first.
2. **Tenant queues** (``queues.TenantQueues``): pending jobs are grouped per tenant, ordered by
   priority then submit time. Requests that cannot run on this inventory at all (a filter no node
   passes, ``filters.unschedulable``), that ask more than the tenant may ever hold, or that wait
   for jobs they depend on are told why straight away and take no part in the passes.
3. **Promises** (``guaranteed.GuaranteedPass.keep_promises``): jobs that reclaimed GPUs in an
   earlier cycle go onto exactly those GPUs.
4. **Guaranteed pass** (``GuaranteedPass.run``), across tenants by priority then submit time: a
   job runs guaranteed while its tenant's guaranteed use plus the job stays within
   ``guaranteed_gpus`` (and its total within the ceiling). The search (``search.GpuSearch``, over
   ``placement.Placer`` and its filters) picks the GPUs: for one GPU, a GPU whose residents'
   requests leave room or an empty one ranked by the score, else one it over-commits; for a gang,
   one node of one model with the cheapest all-reduce, else (after its wait for one node) the
   fewest nodes. No room -> reclaim from borrowers (``reclaim.Reclaimer``: Preempt decisions, the
   job waits as RECLAIMING on GPUs promised to it). No reclaim -> it waits
   (``waiting.WaitExplainer``), and the first such gang may hold a reservation.
5. **Borrowing pass** (``borrowing.BorrowingPass``): everything else, tenant by tenant in
   weighted fair-share order (lowest (decayed usage + GPUs held) / weight first, re-ranked after
   every placement), never past a tenant's ``max_gpus`` (a borrower on a GPU its residents'
   requests over-commit counts its share there, ``usage.charged_milli``); the same search, as
   opportunistic work. A job that does not fit is skipped, not waited on (gangs are protected by
   the reservation instead); a fresh borrower that would over-commit a GPU, or finds no room at
   all, may turn over more-served borrowers (``turnover``).
6. **Moves** (``moves.crowded_borrowers``): a one-GPU borrower sharing its GPU while a GPU of its
   model is still empty (nobody queued could use it) is preempted to restart there alone, if it
   checkpoints.
7. **Duty cycles** (``duty_cycles.throttles``) of running opportunistic jobs move by AIMD from
   live utilisation.

Every placement and wait is written down by ``outcomes.JobOutcomes`` (a placement carries a
``note`` saying which choice was made and why). In both passes a job of an array already running
``array_limit`` jobs (counting this cycle's placements) waits with ``ARRAY_LIMIT`` before any
search, and a user at their limit waits with ``USER_LIMIT``.

The passes are objects handed what they read (``cycle_state.CycleInputs``), what they change
(``CycleState``) and what they may reuse (``Memo``) in their constructors. Capacity only shrinks
within a cycle, so a request shape that failed once fails again: failures are memoised, which is
what keeps 50,000 pending jobs cheap.
"""

from __future__ import annotations

import gc
from collections import defaultdict

from jobs.scheduling.borrowing import BorrowingPass
from jobs.scheduling.capacity import Capacity
from jobs.scheduling.carry import Carry
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import Decisions, Preempt, PreemptReason
from jobs.scheduling.duty_cycles import throttles
from jobs.scheduling.eta import QueueEta, ReleaseTimeline
from jobs.scheduling.moves import crowded_borrowers
from jobs.scheduling.explain import InventoryCheck
from jobs.scheduling.fragmentation_score import (FragmentationScore, cycle_workload, snapshot_hosts,
                                                  snapshot_requests)
from jobs.scheduling.guaranteed import GuaranteedPass
from jobs.scheduling.outcomes import JobOutcomes
from jobs.scheduling.placement import Placer
from jobs.scheduling.queues import TenantQueues
from jobs.scheduling.reclaim import Reclaimer, memory_pressure_victims
from jobs.scheduling.search import GpuSearch
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobClass
from jobs.scheduling.turnover import Turnover
from jobs.scheduling.usage import charged_milli
from jobs.scheduling.user_limits import UserLimits
from jobs.scheduling.waiting import WaitExplainer

GUARANTEED, OPPORTUNISTIC = JobClass.GUARANTEED, JobClass.OPPORTUNISTIC


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
            if carry is None:  # (a carry keeps it for the next cycle: ``Carry.capacity_for``)
                cycle.inputs.capacity.dismantle()
    finally:
        if paused:
            gc.enable()


class Cycle:
    """One run of the steps: the inputs, the state and the memo, and the pass objects built on them."""

    def __init__(self, snapshot: ClusterSnapshot, now: float, config: SchedulerConfig, carry: Carry | None = None):
        capacity = Capacity(snapshot, config) if carry is None else carry.capacity_for(snapshot, config)
        fresh = carry is None
        if fresh:
            carry = Carry()  # (kept for this cycle only: nothing to check it against)
        placer = Placer(capacity, config, FragmentationScore(
            snapshot_requests(snapshot), snapshot_hosts(snapshot), cycle_workload(snapshot, carry))
            if config.placement_score == "fgd" else None)
        inventory = InventoryCheck(capacity, placer)
        if not fresh:
            carry.begin(config, capacity, inventory.reason)
        self.inputs = inputs = CycleInputs(snapshot, now, config, carry, capacity, placer, inventory,
                                           {t.name: t for t in snapshot.tenants})
        self.state = state = CycleState(leaving={job.id for job in snapshot.running if job.preempting})
        self.memo = memo = Memo(carry.reasons)
        borrowed, charged = self._count_running()
        start_held = dict(state.held)
        borrowing_at_start = frozenset(job.tenant for job in snapshot.running
                                       if job.job_class is OPPORTUNISTIC and job.id not in state.leaving)
        # (``borrowed`` and ``leaving`` are shared: a reclaim's victims count for the turnover too)
        self.reclaimer = Reclaimer(capacity, placer, config, now, borrowed, state.leaving, charged)
        turnover = Turnover.of(capacity, placer, config, now, borrowed, state.leaving, charged,
                               snapshot.readings.served_gpu_s, snapshot.running)
        releases = carry.releases_of(snapshot.running)  # (each tenant's timeline is cut from it)
        leaving = state.leaving
        timeline = ReleaseTimeline((), now, [r for r in releases if r[3] not in leaving] if leaving else releases)
        queue_eta = QueueEta(timeline, sum(capacity.start_total_empty) * WHOLE_GPU_MILLI)
        users = UserLimits(snapshot, now)

        search = GpuSearch(inputs, state, memo)
        outcomes = JobOutcomes(inputs, state, memo, users, search)
        waits = WaitExplainer(inputs, state, memo, outcomes, queue_eta, releases, start_held, borrowing_at_start)
        self.tenant_queues = TenantQueues(inputs, state, memo)
        self.guaranteed = GuaranteedPass(inputs, state, memo, search, outcomes, waits, users, self.reclaimer, turnover)
        self.borrowing = BorrowingPass(inputs, state, memo, search, outcomes, waits, users, queue_eta, turnover)

    def _count_running(self) -> tuple[defaultdict[str, int], dict[int, int]]:
        """What each tenant, and each array, holds of the running jobs; returns what each tenant
        borrows (holds, less its stopping jobs, past its guarantee) and what each borrower sharing
        an over-committed GPU counts of that (its share, ``usage.charged_milli``)."""
        state, now = self.state, self.inputs.now
        borrowed: defaultdict[str, int] = defaultdict(int)
        charges: dict[int, int] = {}
        by_id = self.inputs.capacity.by_id
        for job in self.inputs.snapshot.running:
            charged = quota_milli = job.quota_milli
            if job.job_class is GUARANTEED:
                state.guaranteed_held[job.tenant] += quota_milli
            else:
                charged = charged_milli(job.gpu_milli, [_requested(by_id.get(g)) for g in job.gpu_ids], True)
                if charged != quota_milli:
                    charges[job.id] = charged
            state.held[job.tenant] += charged
            if job.id not in state.leaving:
                borrowed[job.tenant] += charged
            if job.array_id is not None:
                state.array_running[job.array_id] += 1
                if job.id not in state.leaving and job.expected_end is not None:
                    state.array_ends[job.array_id].append(max(now, job.expected_end))
        for tenant in borrowed:
            borrowed[tenant] -= self.inputs.quota(tenant).guaranteed_milli
        return borrowed, charges

    def run(self) -> Decisions:
        inputs, state = self.inputs, self.state
        # 1. Memory pressure.
        for victim, gpu_id in memory_pressure_victims(inputs.capacity, inputs.config, state.leaving):
            state.preemptions.append(Preempt(victim.id, PreemptReason.MEMORY_PRESSURE,
                                             f"GPU {gpu_id} is short of memory for a guaranteed job"))
            self.reclaimer.borrowed[victim.tenant] -= self.reclaimer.charged.get(victim.id, victim.quota_milli)
        # 2. Tenant queues.
        queues = self.tenant_queues.build()
        # 3. Promises, 4. the guaranteed pass, 5. the borrowing pass.
        if inputs.snapshot.promises:
            self.guaranteed.keep_promises(queues)
        self.guaranteed.run(queues)
        self.borrowing.run(queues)
        # 6. Crowded borrowers move to GPUs nobody queued could use.
        if inputs.config.move_crowded_borrowers:
            state.preemptions.extend(crowded_borrowers(inputs.capacity, inputs.snapshot.running, state.leaving,
                                                       inputs.now))
        # 7. Duty cycles.
        snapshot = inputs.snapshot
        return Decisions(
            placements=tuple(state.placements), pending=tuple(state.pending), preemptions=tuple(state.preemptions),
            throttles=tuple(throttles(inputs.capacity, snapshot.running, snapshot.readings.jobs, state.leaving,
                                      inputs.config)),
            reservations=tuple(state.reservations), promises=tuple(state.promises), told_at=tuple(state.told_at),
        )


def _requested(gpu) -> int:
    """What a GPU's residents request (a GPU the capacity does not index counts as not shared)."""
    return 0 if gpu is None else gpu.requested_milli
