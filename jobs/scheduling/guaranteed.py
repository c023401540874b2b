"""The guaranteed pass (step 3 of ``cycle``) and the promises kept before it (step 2).

Across tenants by priority then submit time, a job runs guaranteed while its tenant's guaranteed
use plus the job stays within ``guaranteed_gpus`` (and its total within the ceiling). No room ->
reclaim from borrowers (Preempt decisions; the job waits as RECLAIMING, the GPUs freed are promised
to it). No reclaim possible -> it waits, and the first such gang may hold a reservation.
"""

from __future__ import annotations

import heapq

from jobs.scheduling import reasons
from jobs.scheduling.carry import Entry, queue_order
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import PreemptReason
from jobs.scheduling.outcomes import JobOutcomes, node_names
from jobs.scheduling.placement import Choice, OneNodeWait, Shape
from jobs.scheduling.reclaim import RECLAIM_LOOKAHEAD, Gang, Reclaimer
from jobs.scheduling.search import GpuSearch
from jobs.scheduling.snapshot import JobClass, JobRequest
from jobs.scheduling.turnover import Turnover
from jobs.scheduling.user_limits import UserLimits
from jobs.scheduling.waiting import WaitExplainer

GUARANTEED, OPPORTUNISTIC = JobClass.GUARANTEED, JobClass.OPPORTUNISTIC


class GuaranteedPass:
    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo, search: GpuSearch,
                 outcomes: JobOutcomes, waits: WaitExplainer, users: UserLimits, reclaimer: Reclaimer,
                 turnover: Turnover | None):
        self.inputs, self.config, self.capacity, self.placer = inputs, inputs.config, inputs.capacity, inputs.placer
        self.state, self.memo, self.search, self.outcomes, self.waits = state, memo, search, outcomes, waits
        self.users, self.reclaimer, self.turnover = users, reclaimer, turnover

    def room(self, tenant: str) -> int:
        """Milli-GPUs the tenant may still start as guaranteed work."""
        quota = self.inputs.quota(tenant)
        return min(quota.guaranteed_milli - self.state.guaranteed_held[tenant],
                   quota.ceiling_milli - self.state.held[tenant])

    def keep_promises(self, queues: dict[str, list[Entry]]) -> None:
        """Jobs that reclaimed GPUs in an earlier cycle come first, onto exactly those GPUs: their
        victims were chosen for them, and another guaranteed job placed there by best fit would
        leave them to reclaim again (more borrowed work lost). While a job's victims are still
        stopping, its GPUs stay promised and nobody else may take them, but the job itself starts
        elsewhere if it can. A promise yields to guaranteed work of its tenant queued since at a
        higher priority that the guarantee cannot hold beside it, and lapses when it no longer
        holds (a GPU gone, taken or on a node lost or cordoned since, the job past its guarantee or
        at its array's or its user's limit): the passes then treat the job like any other."""
        wanted = {promise.job_id: promise for promise in self.inputs.snapshot.promises}
        state, outcomes = self.state, self.outcomes
        found: list[tuple[Entry, int]] = []  # with the guaranteed milli-GPUs of higher priority ahead
        for tenant in sorted({promise.tenant for promise in wanted.values()}):
            room, higher, level, level_priority = self.room(tenant), 0, 0, None
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
            if job.array_limit is not None and outcomes.array_full(job) or self.users.at_limit(job):
                continue  # (the passes say why, and count its place in line)
            room = self.room(job.tenant)
            if not job.opportunistic_only and need + ahead <= room:
                job_class = GUARANTEED
            elif ((job.opportunistic_only or need > room) and self.turnover is not None
                  and need <= self.inputs.quota(job.tenant).ceiling_milli - state.held[job.tenant]):
                job_class = OPPORTUNISTIC  # a borrower's turnover (``turnover``)
            else:
                continue
            promise = wanted[job.id]
            gpus = [by_id.get(gpu_id) for gpu_id in promise.gpu_ids]
            if None in gpus:
                continue
            choice = self.placer.on_gpus(gpus, shape, job_class)
            if choice is not None:
                outcomes.place(job, shape, job_class, choice)
            elif self.reclaimer.frees(gpus, shape):
                stopping.append((job, shape, promise, gpus, job_class))
        for *_, gpus, _ in stopping:  # (all of them first: no job may start on another's)
            for gpu in gpus:
                self.capacity.block(gpu)
        for job, shape, promise, gpus, job_class in stopping:
            choice = self.search.find(job, shape, job_class)
            if isinstance(choice, Choice):
                outcomes.place(job, shape, job_class, choice)
                continue
            state.handled.add(job.id)
            state.promises.append(promise)
            outcomes.count(job, job_class)
            outcomes.wait(job, reasons.reclaiming(job.gpus, 0, node_names(gpus)) if job_class is GUARANTEED
                          else reasons.turning_over(job.gpus, 0, node_names(gpus)), eta_at=self.inputs.now)

    def run(self, queues: dict[str, list[Entry]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap: list[tuple] = []
        state, limit = self.state, self.config.max_placement_searches
        handled = state.handled  # (jobs that kept a promise already are)

        def push_next(tenant: str) -> None:
            queue = queues[tenant]
            room = self.room(tenant)
            if room < state.smallest_guaranteed_ask[tenant]:
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
            if state.searches >= limit:
                break
            handled.add(job.id)  # placed, reclaiming or waiting: the borrowing pass skips it
            if job.array_limit is not None and self.outcomes.array_full(job):
                self.outcomes.wait_for_array(job)
            elif (capped := self.users.why_waiting(job)) is not None:
                self.outcomes.wait(job, *capped)
            else:
                self._admit(job, shape, lambda t=tenant: queues[t][cursors[t]:cursors[t] + RECLAIM_LOOKAHEAD])
            push_next(tenant)

    def _admit(self, job: JobRequest, shape: Shape, behind=None) -> None:
        """Place the job, else reclaim for it, else say why it waits. ``behind``: the tenant's
        queue entries after it (made only for a reclaim), whose gangs a reclaim keeps room for."""
        choice = self.search.find(job, shape, GUARANTEED)
        if isinstance(choice, OneNodeWait):
            self.outcomes.wait_for_one_node(job, choice)
            return
        if choice is not None:
            self.outcomes.place(job, shape, GUARANTEED, choice)
            return
        state, reclaim = self.state, None
        if state.reclaims < self.config.max_reclaims and not self.memo.failed.fails("reclaim", shape):
            state.reclaims += 1
            reclaim = self.reclaimer.find(job.id, shape, self._gangs_behind(job, behind()) if behind else None)
            if reclaim is None:
                self.memo.failed.record("reclaim", shape)
        if reclaim is None:
            self.waits.blocked(job, shape, GUARANTEED)
            return
        self.outcomes.take_back(job, GUARANTEED, reclaim.victims, reclaim.gpus, PreemptReason.RECLAIM_FOR_GUARANTEE,
                                f"Tenant {job.tenant} needs its guaranteed GPUs back for job {job.id}",
                                reasons.reclaiming(job.gpus, len(reclaim.victims), node_names(reclaim.gpus)))

    def _gangs_behind(self, job: JobRequest, entries: list[Entry]) -> list[Gang]:
        """The gangs among the first ``RECLAIM_LOOKAHEAD`` of ``entries`` (the tenant's queue after
        ``job``) that could run next: the tenant's guarantee holds them once ``job`` and the jobs
        queued between them run, and so do their user's and array's limits (counting those jobs)."""
        room = self.room(job.tenant) - job.gpus * job.gpu_milli
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
            if queued.array_limit is not None and self.outcomes.array_full(queued, arrays.get(array, 0)):
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
