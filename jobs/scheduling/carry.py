"""What one cycle leaves for the next (``Carry``), so that a steady queue is not sorted and
sized again every cycle.

Between two cycles most of 50,000 pending jobs are the very same requests (the snapshot loader
hands back the same ``JobRequest`` objects for rows that did not change), on the same inventory,
under the same config. What ``decide()`` derives from those alone is kept here:

* each request's ``Shape`` and the reason it can never run on this inventory (or None), by
  request key: valid while the config and the inventory (``inventory_key``) stay the same (shapes
  are compared by identity, so a carried queue holds the very objects this table gives out);
* each tenant's ordered queue and the reasons its jobs got before any pass (dependencies,
  over the ceiling, impossible on this inventory): valid while the tenant's pending jobs, its
  ceiling, the config and the inventory stay the same; with it, the queue as columns
  (``QueueColumns``) and the memo keys the borrowing pass last made from them (made again when
  a gang grows old or a hold allows other backfill);
* what jobs were told: the reasons (``InternedReasons``) and the verdict at each position of a
  queue settled in bulk (``QueueColumns.told``), handed out again as the very same objects where
  a cycle would build equal ones, so that the loop can find the verdicts that changed by identity.

Anything else a cycle computes depends on what is free or held now and is never carried. A carry
only ever answers with what a cycle without one would have computed: ``decide(s, now, config,
carry)`` equals ``decide(s, now, config)`` whatever history the carry saw
(tests/scheduling/test_carry.py checks that on random histories). Pure data, like the rest of
the core: the caller keeps one per process and hands it to each cycle in turn (not to two cycles
at once).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple
from itertools import compress
from operator import and_, attrgetter, eq, getitem, is_, is_not, itemgetter, ne, not_

from jobs.scheduling.capacity import Capacity
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Pending, new_pending
from jobs.scheduling.eta import releases_of
from jobs.scheduling.fragmentation import QueueTallies
from jobs.scheduling.interned_reasons import InternedReasons
from jobs.scheduling.placement import Shape
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import JobRequest, RunningJob


UNLIMITED_GPUS = 10**9
# Never an answer: a job with this memo key is settled one by one (``QueueColumns.keys``).
ALONE = object()
# Request keys come and go with the jobs (a recorded profile's peak memory alone takes many
# values): past this many remembered shapes, start again rather than grow for as long as the
# scheduler process lives. (Carried queues keep their own shapes; only new keys are recomputed.)
MAX_SHAPES = 200_000


class Outcome:
    """The borrowing pass's memo key for one tenant's requests of one shape and class
    (opportunistic only or not). Interned per queue and hashed by identity: most of 50,000 jobs
    are settled by a lookup under it, and a tuple key would be built and hashed per job."""

    __slots__ = ("tenant", "shape", "opportunistic_only", "spread_gang", "backfill_key", "young_key", "both_key")

    def __init__(self, tenant: str, shape: Shape, opportunistic_only: bool):
        self.tenant, self.shape, self.opportunistic_only = tenant, shape, opportunistic_only
        self.spread_gang = shape.gpus > 1 and shape.max_nodes != 1  # (may wait for one node while young)
        # The memo keys of its jobs whose answer also depends on the hold or the clock (may
        # backfill the hold, a gang still young enough to wait for one node, both): made when
        # first asked for (a queue of 500 jobs may hold 500 outcomes), hashed by identity, and
        # holding no reference back (a cycle would wait for the collector).
        self.backfill_key = self.young_key = self.both_key = None

    def key(self, backfill: bool, young: bool) -> Outcome | FlaggedOutcome:
        """The memo key of a job of this outcome that may backfill and / or is a young gang."""
        if backfill:
            if young:
                if self.both_key is None:
                    self.both_key = FlaggedOutcome(True, True)
                return self.both_key
            if self.backfill_key is None:
                self.backfill_key = FlaggedOutcome(True, False)
            return self.backfill_key
        if young:
            if self.young_key is None:
                self.young_key = FlaggedOutcome(False, True)
            return self.young_key
        return self

    def __repr__(self) -> str:
        return f"Outcome({self.tenant!r}, {self.shape!r}, opportunistic_only={self.opportunistic_only})"


class FlaggedOutcome:
    """The memo key of an ``Outcome``'s jobs that may backfill the hold and / or are young gangs."""

    __slots__ = ("backfill", "young")

    def __init__(self, backfill: bool, young: bool):
        self.backfill, self.young = backfill, young

    def __repr__(self) -> str:
        return f"FlaggedOutcome(backfill={self.backfill}, young={self.young})"


# A queue entry: the job, its shape, the milli-GPUs it needs, its ``Outcome`` and whether its
# outcome also depends on the hold or the clock (it may backfill, or it may wait for one node).
Entry = tuple[JobRequest, Shape, int, Outcome, bool]


def queue_order(job: JobRequest) -> tuple:
    """Where a job stands in its tenant's queue: priority (high first), submit time, id."""
    return -job.priority, job.submitted_at, job.id


# Jobs a memo key, on average, from which a tenant's queue is settled in bulk (``shares_keys``):
# measured on the loop's queues (26 a key: bulk, 0.93x the instructions of one by one) and on
# bench/scheduler.py's (1.6-5 a key, a recorded profile each: one by one).
SHARED_KEY_JOBS = 4

# Ids of jobs gone that a queue's columns may keep (``QueueColumns.restricted``) beyond twice the
# jobs queued.
STALE_SLACK = 64

# At most this share of a carried queue may be new before it is built again from scratch instead
# (each arrival is sorted in on its own).
MAX_ARRIVED_SHARE = 0.25


@dataclass(slots=True)
class TenantQueue:
    """One tenant's pending jobs (in the snapshot's order) and what the queue step made of them
    (read-only once made, bar ``columns``, made the first time a borrowing pass needs them)."""

    jobs: list[JobRequest]
    ceiling_milli: int
    queue: list[Entry]  # in ``queue_order``
    waits: list[Pending]  # told before any pass, in queue order
    smallest_guaranteed_ask: int  # milli-GPUs of the smallest job in ``queue`` that may run guaranteed
    outcomes: dict[tuple[Shape, bool], Outcome]  # the queue's interned outcomes
    columns: QueueColumns | None = field(default=None, compare=False, repr=False)
    # How many of ``outcomes`` its entries hold (``outcomes`` keeps those of jobs gone since).
    held_outcomes: int | None = field(default=None, compare=False, repr=False)
    # Where among the verdicts of the cycle that last told them each of ``waits`` was told (-1:
    # never; None: none was), as ``QueueColumns.told`` keeps it (``tell_waits``).
    waits_at: list[int] | None = field(default=None, compare=False, repr=False)

    def tell_waits(self, pending: list[Pending], told_at: list[tuple[int, list[int]]]) -> None:
        """Tell ``waits`` at the end of ``pending``, with where each was told before in
        ``told_at`` (``CycleState.told_at``) where that is not here."""
        at = len(pending)
        pending.extend(self.waits)
        if self.waits:
            if self.waits_at is None:
                self.waits_at = [-1] * len(self.waits)
            was_at = _tell_at(self.waits_at, 0, len(self.waits), at)
            if was_at is not None:
                told_at.append((at, was_at))

    @property
    def shares_keys(self) -> bool:
        """Whether its jobs come in few enough requests (at least SHARED_KEY_JOBS jobs a memo key,
        on average) for the borrowing pass to settle most of them by the answer another job of
        their key got; where most jobs are requests of their own or nearly (a recorded profile
        each, say) the runs of answered jobs are short, and one by one costs less."""
        if self.held_outcomes is None:
            self.held_outcomes = len(set(map(itemgetter(3), self.queue)))
        return SHARED_KEY_JOBS * self.held_outcomes <= len(self.queue)

    def columns_of(self) -> QueueColumns:
        if self.columns is None:
            self.columns = QueueColumns(self.queue)
        return self.columns

    def updated(self, jobs: list[JobRequest], entries_of: Callable) -> TenantQueue | None:
        """The same queue for ``jobs``, if most of them are this queue's very jobs: the jobs that
        left (placed, cancelled) are dropped and those that arrived (new, or a new request under
        a known id: edited, requeued) are sorted in, their entries and waits made by
        ``entries_of(jobs in queue order, outcomes)``; the columns follow along. None where a
        rebuild is as cheap, or where the jobs are not what the loader hands back (one id twice)."""
        count = len(self.jobs)
        if len(jobs) > count and all(map(is_, jobs, self.jobs)):  # (by identity, as the entries hold them)
            # Only arrivals, after the jobs of before (how the loader lists jobs submitted since):
            # nothing left, so no job is looked up by id.
            arrived = jobs[count:]
            if len(arrived) > MAX_ARRIVED_SHARE * len(jobs):
                return None
            arrived_ids = set(map(_id, arrived))
            if len(arrived_ids) != len(arrived) or not arrived_ids.isdisjoint(map(_id, self.jobs)):
                return None
            queue, waits, columns, now_by_id = list(self.queue), list(self.waits), self.columns, None
            waits_at = list(self.waits_at or [-1] * len(waits))
            smallest = self.smallest_guaranteed_ask  # (lowered below by the arrivals')
        else:
            now_by_id = {job.id: job for job in jobs}
            before = {job.id: job for job in self.jobs}
            if len(now_by_id) != len(jobs) or len(before) != count:
                return None
            arrived = [job for job in jobs if before.get(job.id) is not job]
            if len(arrived) > MAX_ARRIVED_SHARE * len(jobs):
                return None
            entries, columns = self.queue, self.columns
            if columns is not None:  # (its ids spare reading each job again)
                kept = [position for position, job_id in enumerate(columns.ids)
                        if now_by_id.get(job_id) is entries[position][0]]
                queue = list(map(entries.__getitem__, kept))
                if len(kept) < len(entries):
                    columns = columns.restricted(kept)
            else:
                queue = [entry for entry in entries if now_by_id.get(entry[0].id) is entry[0]]
            stayed = [index for index, wait in enumerate(self.waits)
                      if now_by_id.get(wait.job_id) is before[wait.job_id]]
            waits = list(map(self.waits.__getitem__, stayed))
            waits_at = list(map((self.waits_at or [-1] * len(self.waits)).__getitem__, stayed))
            smallest = min((need for job, _, need, _, _ in queue if not job.opportunistic_only), default=UNLIMITED_GPUS)
        if arrived:
            arrived.sort(key=queue_order)
            new_queue, new_waits, arrived_smallest, _ = entries_of(arrived, self.outcomes)
            smallest = min(smallest, arrived_smallest)
            if new_queue and columns is not None:
                columns = columns.copy()  # (its lists may be shared with the columns it came from)
            for entry in new_queue:
                position = bisect_right(queue, _entry_order(entry), key=_entry_order)
                queue.insert(position, entry)
                if columns is not None:
                    columns.insert(position, entry)
            if new_waits:
                if now_by_id is None:
                    now_by_id = {job.id: job for job in jobs}
                for wait in new_waits:
                    at = bisect_right(waits, queue_order(now_by_id[wait.job_id]),
                                      key=lambda pending: queue_order(now_by_id[pending.job_id]))
                    waits.insert(at, wait)
                    waits_at.insert(at, -1)
        return TenantQueue(jobs, self.ceiling_milli, queue, waits, smallest, self.outcomes, columns, waits_at=waits_at)


class QueueReadings(NamedTuple):
    """What ``QueueColumns`` reads of a queue's jobs: ids, expected runtimes (None: not given) in
    queue order, the positions of jobs of arrays, and the submit times of the gangs that may
    spread, in queue order (None: read them from the queue). Read with them, where the reader
    knew the clock: each entry's memo key without a hold (``QueueColumns.seed_keys``) and how
    many of the gangs are young."""

    ids: list[int]
    runtimes: list[float | None]
    arrays: list[int]
    gang_submitted: list[float] | None
    keys: list | None = None
    young_gangs: int = 0
    # The positions of the gangs that may spread, and of the jobs with a runtime that is a number
    # (None: found from the queue).
    gangs: list[int] | None = None
    timed: list[int] | None = None


class QueueColumns:
    """A queue's entries as columns, for the borrowing pass to settle many at once (C-level slices
    and maps instead of a Python step per job): ids, milli-GPUs needed and memo keys in queue
    order, and what a cycle needs to find the entries whose memo key depends on it (young gangs,
    jobs that may backfill a hold) or that are always settled one by one (jobs of arrays, whose
    limit is counted per job). Those are kept by job id, sorted by submit time and by runtime:
    positions move when a job leaves the queue, ids do not, so a queue that only lost jobs keeps
    them as they are (ids no longer queued are passed over). A carried queue's arrivals are
    sorted into its columns (``insert``), not read again with the whole queue."""

    __slots__ = ("ids", "needs", "outcomes", "gang_ids", "gang_submitted", "backfill_ids", "backfill_runtimes",
                 "array_ids", "_positions", "_keys", "_told")

    def __init__(self, queue: list[Entry], read: QueueReadings | None = None):
        """``read``: what ``queue``'s jobs say, when the caller read it while it had each job at
        hand (a job read again here, in queue order, is a cache miss more: ~0.2 us)."""
        if read is None:
            jobs = list(map(itemgetter(0), queue))
            read = QueueReadings(list(map(_id, jobs)), list(map(_expected_runtime_s, jobs)),
                                 [position for position, job in enumerate(jobs) if job.array_limit is not None], None)
        ids = self.ids = read.ids
        self.needs = list(map(itemgetter(2), queue))
        self.outcomes = list(map(itemgetter(3), queue))
        # Gangs by submit time and jobs with a runtime by runtime: the young gangs are the last
        # ones, the jobs that may backfill a hold the first ones (queue order is by priority first,
        # so these sorts mostly merge runs).
        gangs = (read.gangs if read.gangs is not None
                 else list(compress(range(len(queue)), map(_spread_gang, self.outcomes))))
        submitted = (read.gang_submitted if read.gang_submitted is not None
                     else [queue[position][0].submitted_at for position in gangs])
        order = sorted(range(len(gangs)), key=submitted.__getitem__)
        self.gang_ids = [ids[gangs[i]] for i in order]
        self.gang_submitted = list(map(submitted.__getitem__, order))
        runtimes = read.runtimes
        # (a NaN runtime may never backfill, as ``BorrowingPass._one_by_one``'s test says, and would
        # break the sort)
        with_runtime = (sorted(read.timed, key=runtimes.__getitem__) if read.timed is not None else sorted(
            [position for position, runtime in enumerate(runtimes) if runtime is not None and runtime == runtime],
            key=runtimes.__getitem__))
        self.backfill_ids = list(map(ids.__getitem__, with_runtime))
        self.backfill_runtimes = list(map(runtimes.__getitem__, with_runtime))
        self.array_ids = list(map(ids.__getitem__, read.arrays))
        self._positions: dict[int, int] | None = None  # job id -> position, made when first needed
        self._keys: tuple | None = None  # (what the last keys were made for, the keys)
        # At each position, the verdict last told, the answer, the job it was told for and where
        # among the cycle's verdicts it was told (``told``).
        self._told: tuple[list, list, list, list] | None = None

    def seed_keys(self, keys: list, young_gangs: int) -> None:
        """Take ``keys`` for what ``keys()`` would make without a hold, no job settled one by one
        for its user and ``young_gangs`` of the gangs young (the last ones by submit time: what
        its bisection finds), as read in queue order by whoever built the queue."""
        self._keys = ((len(self.gang_ids) - young_gangs, 0, ()), keys)

    def restricted(self, kept: list[int]) -> QueueColumns:
        """The columns of the queue made of this queue's entries at the positions ``kept`` (in
        order): what a queue that only lost jobs keeps, without reading a job again."""
        columns = object.__new__(QueueColumns)
        columns.ids = list(map(self.ids.__getitem__, kept))
        columns.needs = list(map(self.needs.__getitem__, kept))
        columns.outcomes = list(map(self.outcomes.__getitem__, kept))
        columns.gang_ids, columns.gang_submitted = self.gang_ids, self.gang_submitted
        columns.backfill_ids, columns.backfill_runtimes = self.backfill_ids, self.backfill_runtimes
        columns.array_ids = self.array_ids
        if len(self.gang_ids) + len(self.backfill_ids) + len(self.array_ids) > 2 * len(kept) + STALE_SLACK:
            # A queue that keeps gaining jobs keeps its columns for ever: drop the ids of jobs
            # gone, which otherwise pile up there, once they outnumber the jobs queued.
            queued = set(columns.ids)
            columns.gang_ids, columns.gang_submitted = _only(queued, self.gang_ids, self.gang_submitted)
            columns.backfill_ids, columns.backfill_runtimes = _only(queued, self.backfill_ids, self.backfill_runtimes)
            columns.array_ids = [job_id for job_id in self.array_ids if job_id in queued]
        columns._positions = columns._keys = None
        # (the jobs that stay keep what they were told: a placement elsewhere in the queue does not
        # make every verdict of its tenant new)
        told = self._told
        columns._told = (None if told is None or len(told[0]) != len(self.ids)
                         else tuple(list(map(column.__getitem__, kept)) for column in told))
        return columns

    def copy(self) -> QueueColumns:
        """The same columns in lists of their own (``insert`` changes them in place)."""
        columns = object.__new__(QueueColumns)
        columns.ids, columns.needs, columns.outcomes = list(self.ids), list(self.needs), list(self.outcomes)
        columns.gang_ids, columns.gang_submitted = list(self.gang_ids), list(self.gang_submitted)
        columns.backfill_ids, columns.backfill_runtimes = list(self.backfill_ids), list(self.backfill_runtimes)
        columns.array_ids = list(self.array_ids)
        columns._positions = columns._keys = None
        told = self._told
        columns._told = None if told is None else tuple(map(list, told))
        return columns

    def insert(self, position: int, entry: Entry) -> None:
        """Add the entry now at ``position`` of the queue (an arrival sorted in), as ``__init__``
        would have read it: one entry read, not the whole queue again. (Gangs and runtimes that
        tie keep another order than ``__init__``'s; ``keys`` bisects by value, so no key differs.)"""
        job, _, need, outcome, _ = entry
        job_id = job.id
        self._forget(job_id)  # (a job edited or requeued comes back under its id: never its old self's)
        self.ids.insert(position, job_id)
        self.needs.insert(position, need)
        self.outcomes.insert(position, outcome)
        if outcome.spread_gang:
            at = bisect_right(self.gang_submitted, job.submitted_at)
            self.gang_submitted.insert(at, job.submitted_at)
            self.gang_ids.insert(at, job_id)
        runtime = job.expected_runtime_s
        if runtime is not None and runtime == runtime:  # (a NaN runtime never backfills: see __init__)
            at = bisect_right(self.backfill_runtimes, runtime)
            self.backfill_runtimes.insert(at, runtime)
            self.backfill_ids.insert(at, job_id)
        if job.array_limit is not None:
            self.array_ids.append(job_id)
        self._positions = self._keys = None
        told = self._told
        if told is not None:  # (nothing told at the new position: the others keep theirs)
            for column, nothing in zip(told, (None, None, None, -1)):
                column.insert(position, nothing)

    def told(self, start: int, ids: list[int], answers: list[tuple], at: int) -> tuple[list[Pending], list[int] | None]:
        """The verdicts of the jobs ``ids`` (the queue's from position ``start`` on), each waiting
        with its answer (reason, ETA), to be told at position ``at`` among the cycle's verdicts:
        the very ``Pending`` tuples told last time where the job and the answer at a position are
        the same, else new ones, kept for the next time; and where among the verdicts of the cycle
        that last told them each position was told (-1: never), or None where that is ``at`` on
        (nothing moved). A steady queue is then told what it was told without a verdict built and
        freed again, and the scheduling loop finds the verdicts that changed by identity, at the
        place each was last told (``Decisions.told_at``, ``jobs.services.apply``)."""
        told = self._told
        if told is None or len(told[0]) != len(self.ids):
            told = self._told = ([None] * len(self.ids), [None] * len(self.ids), [None] * len(self.ids),
                                 [-1] * len(self.ids))
        verdicts, told_answers, told_ids, told_at = told
        stop = start + len(ids)
        made = verdicts[start:stop]
        # (answers compare at C speed: the same reason objects, ``InternedReasons``)
        last = told_answers[start:stop]
        if told_ids[start:stop] == ids:
            # Some answers may have moved (an ETA, when a job ended or came ahead): only those
            # jobs are told anew.
            moved = () if last == answers else compress(range(len(ids)), map(ne, last, answers))
        else:  # (jobs joined or left the queue here: those at a position that kept its job and answer stay)
            moved = compress(range(len(ids)), map(not_, map(and_, map(eq, told_ids[start:stop], ids),
                                                                map(eq, last, answers))))
        for index in moved:
            made[index] = new_pending((ids[index], *answers[index]))
        verdicts[start:stop], told_answers[start:stop], told_ids[start:stop] = made, answers, ids
        return made, _tell_at(told_at, start, stop, at)

    def _forget(self, job_id: int) -> None:
        """Drop ``job_id`` from the lists kept by id, where a job gone from the queue stays (passed
        over while its id is not queued, but the id may come back with another request)."""
        for ids, values in ((self.gang_ids, self.gang_submitted), (self.backfill_ids, self.backfill_runtimes)):
            while job_id in ids:
                at = ids.index(job_id)
                del ids[at], values[at]
        while job_id in self.array_ids:
            self.array_ids.remove(job_id)

    def keys(self, now: float, one_node_wait_s: float, backfill_until: float | None, one_by_one: tuple[int, ...],
             alone: object) -> list:
        """Each entry's memo key in a cycle at ``now`` with a hold that jobs expected to end
        within ``backfill_until`` seconds may backfill (None: no hold, or none may), and ``alone``
        at the positions ``one_by_one`` and those of array jobs: the key ``BorrowingPass._one_by_one``
        works out for the job. Found by two bisections with its very tests (a gang is young while
        ``now - submitted_at < one_node_wait_s``; a job may backfill if ``runtime <=
        backfill_until``), and kept for the next cycle that finds the same."""
        young = bisect_left(self.gang_submitted, True, key=lambda submitted_at: now - submitted_at < one_node_wait_s)
        backfill = 0 if backfill_until is None else bisect_left(
            self.backfill_runtimes, True, key=lambda runtime: not runtime <= backfill_until)
        made_for = (young, backfill, one_by_one)
        if self._keys is not None and self._keys[0] == made_for:
            return self._keys[1]
        if young == len(self.gang_ids) and not (backfill or one_by_one or self.array_ids):
            keys = self.outcomes
        else:
            # (slices, maps and a set: C-level steps, not a Python step per young gang or job
            # that may backfill; ids no longer queued map to no position and are passed over)
            positions = self._positions
            if positions is None:
                positions = self._positions = dict(zip(self.ids, range(len(self.ids))))
            keys, outcomes = list(self.outcomes), self.outcomes
            young_at = list(filter(_is_position, map(positions.get, self.gang_ids[young:])))
            if young_at:
                young_of = list(map(outcomes.__getitem__, young_at))
                for outcome in set(young_of):
                    outcome.key(False, True)  # (made when first asked for)
                _consume(map(keys.__setitem__, young_at, map(_young_key, young_of)))
            if backfill:
                backfill_at = list(filter(_is_position, map(positions.get, self.backfill_ids[:backfill])))
                backfill_of = list(map(outcomes.__getitem__, backfill_at))
                young_gangs = set(young_at)
                both = list(map(young_gangs.__contains__, backfill_at))
                for outcome, young_too in set(zip(backfill_of, both)):
                    outcome.key(True, young_too)
                _consume(map(keys.__setitem__, backfill_at, map(getitem, map(_backfill_keys, backfill_of), both)))
            for position in one_by_one:
                keys[position] = alone
            for job_id in self.array_ids:
                position = positions.get(job_id)
                if position is not None:
                    keys[position] = alone
        self._keys = (made_for, keys)
        return keys


_id, _expected_runtime_s, _spread_gang = attrgetter("id"), attrgetter("expected_runtime_s"), attrgetter("spread_gang")
_young_key, _backfill_keys = attrgetter("young_key"), attrgetter("backfill_key", "both_key")
_is_position = partial(is_not, None)
_consume = deque(maxlen=0).extend  # (runs a map for what each step does)


# Positions among a cycle's verdicts as shared int objects (``shared_positions``): a run told where it was
# told last cycle compares equal to what is kept of it at C speed, by identity, and keeping a
# run's positions builds no int.
_SHARED_POSITIONS: list[int] = []


def _tell_at(told_at: list[int], start: int, stop: int, at: int) -> list[int] | None:
    """Keep in ``told_at`` (where among a cycle's verdicts each position of a queue was told)
    that ``start`` to ``stop`` are told from ``at`` on; return where they were told before, or
    None where that is here already."""
    was_at, now_at = told_at[start:stop], shared_positions(at, at + stop - start)
    if was_at == now_at:  # (the very int objects: compared at C speed, by identity)
        return None
    told_at[start:stop] = now_at
    return was_at


def shared_positions(start: int, stop: int) -> list[int]:
    """``list(range(start, stop))``, of the shared int objects."""
    if len(_SHARED_POSITIONS) < stop:
        _SHARED_POSITIONS.extend(range(len(_SHARED_POSITIONS), max(stop, 2 * len(_SHARED_POSITIONS))))
    return _SHARED_POSITIONS[start:stop]


def _only(queued: set[int], ids: list[int], values: list) -> tuple[list[int], list]:
    """``ids`` and their ``values`` (parallel lists), only where the id is ``queued``."""
    kept = [at for at, job_id in enumerate(ids) if job_id in queued]
    return list(map(ids.__getitem__, kept)), list(map(values.__getitem__, kept))


def _entry_order(entry: Entry) -> tuple:
    return queue_order(entry[0])


def inventory_key(capacity: Capacity) -> tuple:
    """Everything of the inventory that ``explain.InventoryCheck`` reads: the pools (model, memory,
    link, runtime, MIG profile) and, per node, its name, whether it takes work or is cordoned, its
    CPU and host memory, and the pool of each GPU. Live readings and residents are left out:
    they change every cycle and no inventory reason depends on them."""
    return (tuple(capacity.pools),
            tuple((node.name, node.schedulable, node.cordoned, node.has_runtime, node.cpu_total, node.host_total_mb,
                   tuple([gpu.pool for gpu in node.gpus])) for node in capacity.nodes))


# Past this many remembered shapes, a change to the inventory drops them all (and the queues)
# rather than ask again of each whether it can run here (~5 us a shape: a cycle built afresh
# costs about what asking 15,000 would).
MAX_RECHECKED_SHAPES = 10_000


class Carry:
    def __init__(self) -> None:
        self._config: SchedulerConfig | None = None
        self._inventory: tuple | None = None
        # Request key -> (Shape, why it can never run here or None, whether that is the request's
        # own fault, not the inventory's).
        self.shapes: dict[tuple, tuple] = {}
        self.queues: dict[str, TenantQueue] = {}
        # Shape -> the same request without CPU or host memory (``WaitExplainer._host_shortage``),
        # interned as the shapes are: the placer's caches key on identity.
        self.plain_shapes: dict[Shape, Shape] = {}
        # The last snapshot's pending jobs (the very tuple) and those jobs by tenant, in its order:
        # a snapshot loader hands back the same tuple while no pending job changed.
        self.by_tenant: tuple[tuple[JobRequest, ...] | None, dict[str, list[JobRequest]]] = (None, {})
        # The caller's word on how the next pending requests were made (``pending_step``).
        self._step: tuple = (None, None, frozenset())
        # The last snapshot's running jobs (the very tuple) and their releases (``releases_of``).
        self._releases: tuple = (None, [])
        # The last cycle's working copy of the capacity, renewed for the next (``Capacity.renew``).
        self.capacity: Capacity | None = None
        # The reasons jobs were told, handed out again as the same objects (``Memo.reason``).
        self.reasons = InternedReasons()
        # FGD's target workload's classes of each tenant's queue (``fragmentation.QueueTallies``).
        self.tallies = QueueTallies()

    def capacity_for(self, snapshot, config: SchedulerConfig) -> Capacity:
        """The cycle's working copy of ``snapshot``'s capacity: the last cycle's, renewed, where
        that can be done; else a new one (the last one is then let go)."""
        kept, self.capacity = self.capacity, None  # (none kept if renewing fails half-way)
        if kept is not None:
            if kept.renew(snapshot, config):
                self.capacity = kept
                return kept
            kept.dismantle()
        self.capacity = Capacity(snapshot, config)
        return self.capacity

    def pending_step(self, before: tuple[JobRequest, ...] | None, after: tuple[JobRequest, ...] | None,
                     changed: frozenset[int]) -> None:
        """The caller's word that the pending requests ``after`` were made from ``before`` (both by
        job id) by building again only the requests of the jobs ``changed``, which came, went or
        changed; every other request of ``after`` is the very object it was in ``before``. Where
        the last cycle's requests are ``before`` and this one's ``after``, ``tenants_of`` moves
        those jobs only, and the other tenants keep their very lists. (A loop cycle after a few
        placements went over every pending job: 40 ms at 200,000.)"""
        self._step = (before, after, changed)

    def releases_of(self, running: tuple[RunningJob, ...]) -> list[tuple[float, int, str, int]]:
        """``eta.releases_of(running)`` (read-only), kept while it is the same tuple: a release is
        a time, not seconds from now, so the same running jobs release the same (a sort of 4,000
        running jobs every cycle)."""
        if self._releases[0] is not running or type(running) is not tuple:
            self._releases = (running, releases_of(running))
        return self._releases[1]

    def tenants_of(self, pending: tuple[JobRequest, ...]) -> dict[str, list[JobRequest]]:
        """``pending`` by tenant, in its order (read-only: kept for the next cycle while it is the
        same tuple, each list while its tenant's jobs are the same)."""
        if self.by_tenant[0] is not pending or type(pending) is not tuple:
            before, after, changed = self._step
            if before is not None and before is self.by_tenant[0] and after is pending and type(pending) is tuple:
                stepped = _stepped(self.by_tenant[1], before, after, changed)
                if stepped is not None:
                    self.by_tenant = (pending, stepped)
                    return stepped
            by_tenant: dict[str, list[JobRequest]] = {}
            for job in pending:
                jobs = by_tenant.get(job.tenant)
                if jobs is None:
                    jobs = by_tenant[job.tenant] = []
                jobs.append(job)
            self.by_tenant = (pending, by_tenant)
        return self.by_tenant[1]

    def begin(self, config: SchedulerConfig, capacity: Capacity,
              inventory_reason: Callable[[Shape], PendingReason | None]) -> None:
        """Start a cycle: forget everything if the config changed. If the inventory did (a node
        cordoned, gone or back), the shapes stay (a request and the config make them) and
        ``inventory_reason`` tells again which can never run here: the queues stay too where
        every answer is the same (most changes to a cluster of 1,024 nodes leave every request
        as possible as it was), else they are built again. (Past ``MAX_RECHECKED_SHAPES`` shapes
        everything is forgotten instead.)"""
        inventory = inventory_key(capacity)
        if config != self._config:
            self._config, self._inventory = config, inventory
            self.shapes, self.queues, self.plain_shapes = {}, {}, {}
        elif len(self.shapes) > (MAX_RECHECKED_SHAPES if inventory != self._inventory else MAX_SHAPES):
            # (the queues go too: a cycle interns one Shape per request key, and memos and the
            # search budget count by Shape identity, so a carried queue must hold the shapes
            # this table hands out)
            self.shapes, self.queues, self.plain_shapes = {}, {}, {}
        if inventory != self._inventory:
            self._inventory = inventory
            shapes = self.shapes
            for key, (shape, reason, invalid) in shapes.items():
                if not invalid and (now := inventory_reason(shape)) != reason:
                    shapes[key] = (shape, now, False)
                    self.queues = {}


def _stepped(by_tenant: dict[str, list[JobRequest]], before: tuple[JobRequest, ...], after: tuple[JobRequest, ...],
             changed: frozenset[int]) -> dict[str, list[JobRequest]] | None:
    """``by_tenant`` (``before`` by tenant) made ``after``'s, where only the jobs ``changed`` differ
    (``Carry.pending_step``): the lists of the tenants those jobs were or are of made again, the
    others the same lists; tenants in the order a pass over ``after`` would give (each tenant's
    first job, by id). None where the lists do not add up to ``after`` (not made as the caller said)."""
    gone = [job for job in map(partial(_by_id, before), changed) if job is not None]
    came = sorted((job for job in map(partial(_by_id, after), changed) if job is not None), key=_id)
    stepped = dict(by_tenant)
    for tenant in {job.tenant for job in gone} | {job.tenant for job in came}:
        jobs = [job for job in by_tenant.get(tenant, ()) if job.id not in changed]
        for job in came:
            if job.tenant == tenant:
                insort(jobs, job, key=_id)
        if jobs:
            stepped[tenant] = jobs
        else:
            stepped.pop(tenant, None)
    if sum(map(len, stepped.values())) != len(after):
        return None
    return dict(sorted(stepped.items(), key=_first_job_id))


def _by_id(requests: tuple[JobRequest, ...], job_id: int) -> JobRequest | None:
    """The request of ``job_id`` in ``requests`` (by job id), or None."""
    at = bisect_left(requests, job_id, key=_id)
    return requests[at] if at < len(requests) and requests[at].id == job_id else None


def _first_job_id(item: tuple[str, list[JobRequest]]) -> int:
    return item[1][0].id
