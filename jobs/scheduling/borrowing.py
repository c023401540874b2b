"""The borrowing pass (step 4 of ``cycle``): everything the guaranteed pass left, tenant by tenant
in weighted fair-share order (lowest (decayed usage + GPUs held) / weight first, re-ranked after
every placement), never past a tenant's ``max_gpus``. Within a tenant, priority then submit time;
a job that does not fit is skipped, not waited on (gangs are protected by the reservation instead).

At 50,000 pending jobs this pass sees every one of them, and almost all are settled without a
search: a tenant's requests of one shape get the same answer until something changes (a
placement, a hold, the search budget running out). Where a tenant's jobs come in few requests
(``TenantQueue.shares_keys``), the first job of each memo key is settled one by one and the jobs
after it by the answer it got: a few inline, then whole runs at once (``_settle_known``: slices
and maps over the queue's carried columns, one map to build their ``Pending``). Where nearly every
job is a request of its own, each is settled one by one (``_one_by_one``), as every job was
before. Jobs whose answer is their own (array jobs, members of users with limits, jobs already
handled) always go one by one. Either way the decisions are the same
(tests/scheduling/test_borrowing.py).
"""

from __future__ import annotations

import heapq
from operator import itemgetter

from jobs.scheduling import reasons
from jobs.scheduling.carry import ALONE, Entry, FlaggedOutcome, Outcome
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import PreemptReason, new_pending
from jobs.scheduling.eta import QueueEta
from jobs.scheduling.outcomes import JobOutcomes, node_names
from jobs.scheduling.placement import OneNodeWait, Shape
from jobs.scheduling.search import GpuSearch
from jobs.scheduling.snapshot import JobClass, JobRequest, TenantQuota
from jobs.scheduling.turnover import Turnover
from jobs.scheduling.usage import weighted_share
from jobs.scheduling.user_limits import UserLimits
from jobs.scheduling.waiting import WaitExplainer

OPPORTUNISTIC = JobClass.OPPORTUNISTIC

_reason_of, _eta_of = itemgetter(0), itemgetter(1)

# In an answer in place of an ETA: the job's ETA is the queue's next (``QueueEta.next``).
QUEUED = object()
# Kept with the answers: the state they are true for (version, ETAs exhausted, out of searches).
ANSWERED_AT = object()
# Jobs with answered keys in a row settled one at a time before the rest of the run is settled
# in bulk, looked up FIRST_CHUNK at a time at first, doubling while all are answered.
BULK_AFTER, FIRST_CHUNK, LARGEST_CHUNK = 4, 16, 1024


class BorrowingPass:
    # Settle the jobs that share an answered memo key many at a time (False: every job one by one,
    # as the tests compare).
    settle_in_bulk = True

    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo, search: GpuSearch,
                 outcomes: JobOutcomes, waits: WaitExplainer, users: UserLimits, queue_eta: QueueEta,
                 turnover: Turnover | None):
        self.inputs, self.now, self.config, self.carry = inputs, inputs.now, inputs.config, inputs.carry
        self.state, self.memo, self.search, self.outcomes, self.waits = state, memo, search, outcomes, waits
        self.users, self.queue_eta, self.turnover = users, queue_eta, turnover

    def run(self, queues: dict[str, list[Entry]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap = [(self._share(t), t) for t in queues]
        heapq.heapify(heap)
        held, carried = self.state.held, self.carry.queues
        while heap:
            _, tenant = heapq.heappop(heap)
            queue, quota = queues[tenant], self.inputs.quota(tenant)
            position, end = cursors[tenant], len(queue)
            if held[tenant] >= quota.ceiling_milli:  # at the ceiling: nothing more of this tenant can run
                self._all_at_ceiling(queue, position, quota)
                continue
            # What the tenant holds moves only with a placement, which ends this visit.
            room = quota.ceiling_milli - held[tenant]
            if self.settle_in_bulk and carried[tenant].shares_keys:
                cursor = self._visit_in_bulk(tenant, queue, quota, room, position)
            else:
                cursor, _ = self._one_by_one(tenant, queue, quota, room, position, end, None)
            cursors[tenant] = cursor  # (after a placement the tenant goes back in line at its new share)
            if cursor < end:
                heapq.heappush(heap, (self._share(tenant), tenant))

    def _visit_in_bulk(self, tenant: str, queue: list[Entry], quota, room: int, position: int) -> int:
        """Settle ``tenant``'s queue from ``position`` on, the first job of each memo key one by
        one and the jobs after it with the answer that one got; stop after a placement. Returns
        where the tenant's next visit starts."""
        queue_eta, end = self.queue_eta, len(queue)
        columns = self.carry.queues[tenant].columns_of()
        ids, needs = columns.ids, columns.needs
        # Memo key -> (reason, ETA or QUEUED) for the rest of the jobs with that key, while true
        # (``_one_by_one`` empties it when the version, the search budget or the queue's ETAs move).
        answers: dict = {}
        while position < end:
            keys = self._memo_keys(tenant, queue, columns)  # (a hold may have come since)
            position, placed = self._one_by_one(tenant, queue, quota, room, position, end, answers, keys)
            if placed or position == end:
                return position
            # A run of jobs whose keys were answered: most likely many more follow, settled a chunk
            # at a time until a job to settle one by one (or until the queue's ETAs run out: the
            # answers that named the queue's next ETA are then untrue).
            chunk, exhausted = FIRST_CHUNK, queue_eta.exhausted
            while position < end and queue_eta.exhausted == exhausted:
                found = list(map(answers.get, keys[position:position + chunk]))
                try:
                    settled = found.index(None)
                    del found[settled:]
                except ValueError:
                    settled = len(found)
                    chunk = min(2 * chunk, LARGEST_CHUNK)
                if not settled:
                    break
                self._settle_known(columns, ids[position:position + settled], found, needs, position)
                position += settled
        return end

    def _one_by_one(self, tenant: str, queue: list[Entry], quota, room: int, start: int, stop: int,
                    answers: dict | None = None, keys: list | None = None) -> tuple[int, bool]:
        """Settle the entries of ``tenant``'s queue from ``start`` to ``stop`` one at a time, as
        every job was before bulk settling: place the job or say why it waits, and stop after a
        placement. Returns where the next job is and whether one was placed.

        With ``answers`` (and each entry's memo key in ``keys``): a job whose key was answered
        gets that answer (kept while true: emptied when the version, the search budget or the
        queue's ETAs move), each answer a job's key gave is kept there, and it stops before the
        job after ``BULK_AFTER`` answered ones in a row, for ``_visit_in_bulk`` to settle the run."""
        state, memo, now, outcomes = self.state, self.memo, self.now, self.outcomes
        handled, limit = state.handled, self.config.max_placement_searches
        one_node_wait, users_limited = self.config.gang_single_node_wait_s, bool(self.users.limits)
        append_pending, queue_eta = state.pending.append, self.queue_eta
        version, backfill_until, known, by_need = -1, None, None, None
        run = 0
        if answers is not None:
            at_version, at_exhausted, at_out = answers.get(ANSWERED_AT, (None, None, None))
        for position in range(start, stop):
            job, shape, need, outcome, depends = queue[position]
            if answers is not None:
                if (state.version != at_version or queue_eta.exhausted != at_exhausted
                        or (state.searches >= limit) != at_out):  # (what they were true for has moved)
                    at_version, at_exhausted, at_out = state.version, queue_eta.exhausted, state.searches >= limit
                    answers.clear()
                    answers[ANSWERED_AT], run = (at_version, at_exhausted, at_out), 0
                    # (a hold moves the version too: ``WaitExplainer._hold``; only a hold changes the keys)
                    holder = state.holder
                    if (None if holder is None else holder[2]) != memo.keys[tenant][0]:
                        return position, False  # a hold came: which jobs may backfill it is asked again
                answer = answers.get(keys[position])
                if answer is not None:
                    if run == BULK_AFTER:
                        return position, False
                    run += 1
                    if job.id not in handled:
                        reason, eta = answer
                        if eta is QUEUED:
                            eta = None if queue_eta.exhausted else queue_eta.next(need)
                        append_pending(new_pending((job.id, reason, eta)))
                    continue
                run = 0
            if job.id in handled:
                continue
            if job.array_limit is not None and outcomes.array_full(job):
                outcomes.wait_for_array(job)
                continue
            if users_limited and (capped := self.users.why_waiting(job)) is not None:
                outcomes.wait(job, *capped)
                continue
            if state.version != version:
                version, holder = state.version, state.holder
                backfill_until = None if holder is None else holder[2]
                known = memo.now(version)
            # Its memo key: its outcome, set apart when it may backfill the hold (``may_backfill``)
            # or is a gang young enough to wait for one node (``GpuSearch.young_gang``).
            key = outcome
            if depends:
                backfill = (backfill_until is not None and (runtime := job.expected_runtime_s) is not None
                            and runtime <= backfill_until)
                young = outcome.spread_gang and now - job.submitted_at < one_node_wait
                if backfill:
                    key = (outcome.both_key if young else outcome.backfill_key) or outcome.key(True, young)
                elif young:
                    key = outcome.young_key or outcome.key(False, True)
            if need > room:
                if by_need is None:
                    by_need = self.waits.ceiling_waits(tenant)
                answer = by_need.get(need) or self.waits.ceiling_wait(quota, need)
                append_pending(new_pending((job.id, *answer)))
            elif state.searches >= limit:
                answer = (memo.reason(reasons.not_considered, limit), None)
                append_pending(new_pending((job.id, *answer)))
            else:
                reason = known.get(key)
                if reason is None:
                    if self._admit(job, shape, key):
                        return position + 1, True
                    # (unless the answer was the job's own, or a hold taken meanwhile changed it)
                    if answers is None or state.version != version or (reason := known.get(key)) is None:
                        continue
                else:
                    append_pending(new_pending((job.id, reason, None if queue_eta.exhausted else queue_eta.next(need))))
                answer = (reason, None if queue_eta.exhausted else QUEUED)
            if answers is not None:
                answers[key] = answer
        return stop, False

    def _memo_keys(self, tenant: str, queue: list[Entry], columns) -> list:
        """The memo key of each entry of ``tenant``'s queue (``ALONE`` for those settled one by one)
        at this state of the hold; made once per tenant and hold."""
        holder = self.state.holder
        backfill_until = None if holder is None else holder[2]
        made = self.memo.keys.get(tenant)
        if made is not None and made[0] == backfill_until:
            return made[1]
        one_by_one = ()
        if self.users.limits:
            limits = self.users.limits
            one_by_one = tuple(position for position, entry in enumerate(queue) if (tenant, entry[0].user) in limits)
        keys = columns.keys(self.now, self.config.gang_single_node_wait_s, backfill_until, one_by_one, ALONE)
        self.memo.keys[tenant] = (backfill_until, keys)
        return keys

    def _settle_known(self, columns, ids: list[int], answers: list[tuple], needs: list[int], start: int) -> None:
        """The jobs ``ids`` (the queue's from position ``start`` on, in ``columns``) wait with their
        key's answer."""
        handled, queue_eta = self.state.handled, self.queue_eta
        pending = self.state.pending
        if handled and not handled.isdisjoint(ids):
            kept = [(job_id, answer, need) for job_id, answer, need in zip(ids, answers, needs[start:start + len(ids)])
                    if job_id not in handled]
            ids, answers, needs, start = [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept], 0
            columns = None  # (no longer the queue's positions: told anew)
        if queue_eta.exhausted:  # (then no answer holds QUEUED: each is a (reason, ETA) to put after the id)
            if columns is not None:
                self._tell(columns, start, ids, answers)
            else:
                pending.extend(map(new_pending, zip(ids, map(_reason_of, answers), map(_eta_of, answers))))
            return
        append = pending.append
        for offset, (job_id, (reason, eta), need) in enumerate(zip(ids, answers, needs[start:start + len(ids)])):
            if eta is QUEUED:
                if queue_eta.exhausted and columns is not None:
                    # (the queue's ETAs ran out here: the rest are told with none, as in bulk)
                    rest = [(told, None if when is QUEUED else when) for told, when in answers[offset:]]
                    self._tell(columns, start + offset, ids[offset:], rest)
                    return
                eta = None if queue_eta.exhausted else queue_eta.next(need)
            append(new_pending((job_id, reason, eta)))

    def _tell(self, columns, start: int, ids: list[int], answers: list[tuple]) -> None:
        """The jobs ``ids`` (the queue's from position ``start`` on, in ``columns``) wait with
        ``answers``, told as a run (``QueueColumns.told``, ``Decisions.told_at``)."""
        pending = self.state.pending
        at = len(pending)
        made, was_at = columns.told(start, ids, answers, at)
        pending.extend(made)
        if was_at is not None:
            self.state.told_at.append((at, was_at))

    def _turn_over(self, job: JobRequest, shape: Shape) -> bool:
        """Preempt more-served borrowers for a fresh one that would otherwise over-commit a GPU
        (``turnover``); it waits for them to stop. False: none to preempt (it over-commits)."""
        state = self.state
        if state.reclaims >= self.config.max_reclaims or self.memo.failed.fails("turnover", shape):
            return False
        state.reclaims += 1
        found = self.turnover.find(job.id, shape)
        if found is None:
            self.memo.failed.record("turnover", shape)
            return False
        self.outcomes.take_back(job, OPPORTUNISTIC, found.victims, found.gpus, PreemptReason.LEAST_ATTAINED,
                                f"Job {job.id} has had less GPU time: borrowed GPUs go to the least served first",
                                reasons.turning_over(job.gpus, len(found.victims), node_names(found.gpus)))
        return True

    def _admit(self, job: JobRequest, shape: Shape, key: Outcome | FlaggedOutcome) -> bool:
        """A job whose outcome under ``key`` is not known at this version: search, then place it or
        say why not (and remember that answer for the same key)."""
        version = self.state.version
        choice = self.search.find(job, shape, OPPORTUNISTIC)
        if isinstance(choice, OneNodeWait):
            self.outcomes.wait_for_one_node(job, choice)  # not memoised: its ETA is its own
            return False
        if choice is not None:
            if self.turnover is not None and self.turnover.wants(job, shape, choice) and self._turn_over(job, shape):
                return True  # (what its tenant holds moved, as with a placement: the visit ends)
            self.outcomes.place(job, shape, OPPORTUNISTIC, choice)
            self.state.borrowing_tenants.add(job.tenant)
            return True
        # No room at all (a gang, a GPU's memory full): a fresh borrower turns over the most served
        # ones too, as LAS would (``config.turnover_when_blocked``).
        if (self.config.turnover_when_blocked and self.turnover is not None
                and job.attained_gpu_s < self.turnover.served_gpu_s and self._turn_over(job, shape)):
            return True
        reason = self.waits.blocked(job, shape, OPPORTUNISTIC)
        if self.state.version == version:  # (a hold taken meanwhile changed the answer)
            self.memo.now(version)[key] = reason
        return False

    def _all_at_ceiling(self, queue: list[Entry], position: int, quota: TenantQuota) -> None:
        """Every job of ``queue`` from ``position`` on waits for its tenant's ceiling: what each is
        told depends only on the milli-GPUs it needs."""
        by_need = self.waits.ceiling_waits(quota.name)
        handled, pending = self.state.handled, self.state.pending
        if self.settle_in_bulk:
            columns = self.carry.queues[quota.name].columns_of()
            ids, needs = columns.ids[position:], columns.needs[position:]
            if handled.isdisjoint(ids):
                # (tens of thousands of jobs at their ceiling, a handful of needs: C-level maps)
                for need in dict.fromkeys(needs):  # (each distinct need once, in queue order)
                    if need not in by_need:
                        self.waits.ceiling_wait(quota, need)
                self._tell(columns, position, ids, list(map(by_need.__getitem__, needs)))
                return
        for job, _, need, _, _ in queue[position:]:
            if job.id in handled:
                continue
            found = by_need.get(need)
            if found is None:
                found = self.waits.ceiling_wait(quota, need)
            pending.append(new_pending((job.id, *found)))

    def _share(self, tenant: str) -> float:
        quota = self.inputs.quota(tenant)
        return weighted_share(quota.decayed_usage, self.state.held[tenant], quota.weight, self.config.usage_half_life_s)
