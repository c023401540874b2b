"""The borrowing pass (step 4 of ``cycle``): everything the guaranteed pass left, tenant by tenant
in weighted fair-share order, never past a tenant's ``max_gpus``.

Part of ``cycle.Cycle``, as ``waiting.Waiting`` is. At 50,000 pending jobs this pass sees every
one of them, and almost all are settled without a search: a tenant's requests of one shape get
the same answer until something changes (a placement, a hold, the search budget running out), so
the first job of each memo key is settled one by one and the rest of the queue by the answers
those gave, many at a time (``_settle_known``: slices and maps over the queue's columns, one
comprehension to build their ``Pending``). Jobs whose answer is their own (array jobs, members of
users with limits, jobs already handled) always go one by one. Settling one by one every job,
as a cycle did before, gives the very same decisions (tests/scheduling/test_borrowing.py).
"""

from __future__ import annotations

import heapq

from jobs.scheduling import reasons
from jobs.scheduling.carry import Entry, FlaggedOutcome, Outcome
from jobs.scheduling.decisions import new_pending
from jobs.scheduling.placement import OneNodeWait, Shape
from jobs.scheduling.snapshot import JobClass, JobRequest

OPPORTUNISTIC = JobClass.OPPORTUNISTIC

# Never an answer: a job with this memo key is settled one by one (``QueueColumns.keys``).
ALONE = object()
# In an answer in place of an ETA: the job's ETA is the queue's next (``QueueEta.next``).
QUEUED = object()
# Entries looked up at once, at first after a job settled one by one (the next of its key usually
# is near), doubling while all are answered.
FIRST_CHUNK, LARGEST_CHUNK = 8, 1024


class Borrowing:
    # Settle the jobs that share an answered memo key many at a time (False: every job one by one,
    # as the tests compare).
    settle_in_bulk = True

    def _borrowing_pass(self, queues: dict[str, list[Entry]]) -> None:
        cursors = dict.fromkeys(queues, 0)
        heap = [(self._share(t), t) for t in queues]
        heapq.heapify(heap)
        state, limit, queue_eta = self.state, self.config.max_placement_searches, self.queue_eta
        held = state.held
        while heap:
            _, tenant = heapq.heappop(heap)
            queue, quota = queues[tenant], self.quota(tenant)
            ceiling = quota.ceiling_milli
            position, end = cursors[tenant], len(queue)
            if held[tenant] >= ceiling:  # at the ceiling: nothing more of this tenant can run
                self._all_at_ceiling(queue[position:], quota)
                continue
            # What the tenant holds moves only with a placement, which ends this visit.
            room, cursor = ceiling - held[tenant], end
            columns = self.carry.queues[tenant].columns_of()
            ids, needs = columns.ids, columns.needs
            # Memo key -> (reason, ETA or QUEUED) for the rest of the jobs with that key: true
            # while the version (placements, the hold), the search budget and whether the queue's
            # ETAs ran out stay as they were (``at``).
            answers: dict = {}
            answered_at, keys, chunk = None, None, FIRST_CHUNK
            while position < end:
                at = (state.version, state.searches >= limit, queue_eta.exhausted)
                if at != answered_at:
                    answers, answered_at = {}, at
                    keys = self._memo_keys(tenant, queue, columns)
                stop = min(end, position + chunk)
                found = list(map(answers.get, keys[position:stop]))
                try:
                    settled = found.index(None)
                except ValueError:
                    settled = stop - position
                if settled:
                    if settled < len(found):
                        del found[settled:]
                    self._settle_known(ids[position:position + settled], found, needs, position)
                    position += settled
                    if position == stop:
                        chunk = min(2 * chunk, LARGEST_CHUNK)
                        continue
                chunk = FIRST_CHUNK
                if self._settle_one(queue[position], keys[position], room, quota, answers):
                    cursor = position + 1  # placed: the tenant goes back in line at its new share
                    break
                position += 1
            cursors[tenant] = cursor
            if cursor < end:
                heapq.heappush(heap, (self._share(tenant), tenant))

    def _memo_keys(self, tenant: str, queue: list[Entry], columns) -> list:
        """The memo key of each entry of ``tenant``'s queue (``ALONE`` for those settled one by one)
        at this state of the hold; made once per tenant and hold."""
        holder = self.state.holder
        backfill_until = None if holder is None else holder[2]
        made = self.memo.keys.get(tenant)
        if made is not None and made[0] == backfill_until:
            return made[1]
        if not self.settle_in_bulk:
            keys = [ALONE] * len(queue)
        else:
            one_by_one = ()
            if self.users.limits:
                limits = self.users.limits
                one_by_one = tuple(position for position, entry in enumerate(queue) if (tenant, entry[0].user) in limits)
            keys = columns.keys(self.now, self.config.gang_single_node_wait_s, backfill_until, one_by_one, ALONE)
        self.memo.keys[tenant] = (backfill_until, keys)
        return keys

    def _memo_key(self, job: JobRequest, outcome: Outcome, depends: bool) -> Outcome | FlaggedOutcome:
        """The key the borrowing pass's memo answers ``job`` under: its outcome, set apart when the
        job may backfill the hold or is a gang young enough to wait for one node."""
        if not depends:
            return outcome
        holder = self.state.holder
        backfill_until = None if holder is None else holder[2]
        backfill = (backfill_until is not None and (runtime := job.expected_runtime_s) is not None
                    and runtime <= backfill_until)
        young = outcome.spread_gang and self.now - job.submitted_at < self.config.gang_single_node_wait_s
        return outcome.key(backfill, young)

    def _settle_known(self, ids: list[int], answers: list[tuple], needs: list[int], start: int) -> None:
        """The jobs ``ids`` (the queue's from position ``start`` on) wait with their key's answer."""
        handled, queue_eta = self.state.handled, self.queue_eta
        pending = self.state.pending
        if handled and not handled.isdisjoint(ids):
            kept = [(job_id, answer, need) for job_id, answer, need in zip(ids, answers, needs[start:start + len(ids)])
                    if job_id not in handled]
            ids, answers, needs, start = [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept], 0
        if queue_eta.exhausted:  # (then no answer holds QUEUED: each is a (reason, ETA) to append to the id)
            pending.extend(map(new_pending, map(tuple.__add__, zip(ids), answers)))
            return
        append = pending.append
        for job_id, (reason, eta), need in zip(ids, answers, needs[start:start + len(ids)]):
            if eta is QUEUED:
                eta = None if queue_eta.exhausted else queue_eta.next(need)
            append(new_pending((job_id, reason, eta)))

    def _settle_one(self, entry: Entry, key, room: int, quota, answers: dict) -> bool:
        """Place ``entry``'s job or say why it waits; record the answer its key gave in
        ``answers`` where the rest of the jobs with that key get the same. True if placed."""
        job, shape, need, outcome, depends = entry
        state = self.state
        if job.id in state.handled:
            return False
        if job.array_limit is not None and self._array_full(job):
            self._wait_for_array(job)
            return False
        if self.users.limits and (capped := self.users.why_waiting(job)) is not None:
            self._wait(job, *capped)
            return False
        if key is ALONE:
            key = self._memo_key(job, outcome, depends)
        if need > room:
            found = self._ceiling_waits(quota.name).get(need) or self._ceiling_wait(quota, need)
            state.pending.append(new_pending((job.id, *found)))
            answers[key] = found
            return False
        limit = self.config.max_placement_searches
        if state.searches >= limit:
            reason = self._reason(reasons.not_considered, limit)
            self._wait(job, reason)
            answers[key] = (reason, None)
            return False
        reason = self.memo.now(state.version).get(key)
        if reason is None:
            if self._admit_borrowing(job, shape, key):
                return True
            reason = self.memo.now(state.version).get(key)  # (unless the answer was the job's own)
            if reason is not None:
                answers[key] = (reason, None if self.queue_eta.exhausted else QUEUED)
            return False
        queue_eta = self.queue_eta
        state.pending.append(new_pending((job.id, reason, None if queue_eta.exhausted else queue_eta.next(need))))
        answers[key] = (reason, None if queue_eta.exhausted else QUEUED)
        return False

    def _admit_borrowing(self, job: JobRequest, shape: Shape, key: Outcome | FlaggedOutcome) -> bool:
        """A job whose outcome under ``key`` is not known at this version: search, then place it or
        say why not (and remember that answer for the same key)."""
        version = self.state.version
        choice = self._find(job, shape, OPPORTUNISTIC)
        if isinstance(choice, OneNodeWait):
            self._wait_for_one_node(job, choice)  # not memoised: its ETA is its own
            return False
        if choice is not None:
            self._place(job, shape, OPPORTUNISTIC, choice)
            self.state.borrowing_tenants.add(job.tenant)
            return True
        reason = self._blocked(job, shape, OPPORTUNISTIC)
        if self.state.version == version:  # (a hold taken meanwhile changed the answer)
            self.memo.now(version)[key] = reason
        return False
