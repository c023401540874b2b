"""Carry out the core's decisions: one transaction, conditional updates, commands after commit.

Job state changes go through :mod:`jobs.services.lifecycle`, each conditional on the state the
core saw: a job cancelled between snapshot and apply is simply skipped. Redis commands are published in
``on_commit``, so a rolled-back cycle sends nothing; a crash after commit but before publish
leaves a PLACED job whose launch is re-sent by ``resend_unstarted_launches``, and a stop lost the
same way is re-sent by ``resend_stops``.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from functools import partial
from itertools import compress, repeat
from operator import and_, attrgetter, eq, is_, is_not, itemgetter, not_
from datetime import datetime, timezone as dt_timezone

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from jobs.choices import TERMINAL_STATES, RunClass, JobState
from jobs.models import Allocation, Job, JobPromise, JobWait
from jobs.scheduling import Decisions, JobRequest
from jobs.scheduling.carry import shared_positions
from jobs.scheduling.decisions import Throttle
from jobs.services import lifecycle, snapshot_loader
from jobs.services.commands import duty_cycle_commands, publish_many, send_stop
from jobs.services.launches import LAUNCH_RELATED, send_attempt
from jobs.services.job_feed import VerdictFeed, loop_writes_verdicts
from jobs.services.row_versions import LISTED, RowVersions, listing, own_xid, steady_scan_order
from jobs.services.table_changes import mark_sql, marks


@dataclass(frozen=True)
class Applied:
    placed: int = 0
    preempted: int = 0
    throttled: int = 0


def apply_decisions(decisions: Decisions, decided_on: tuple[JobRequest, ...] | None = None) -> Applied:
    """``decided_on``: the pending jobs of the snapshot these decisions were made on (the loop's):
    then the queue is not listed again to learn which jobs are pending and reserved (see
    :func:`_as_read`)."""
    now = timezone.now()
    with transaction.atomic():
        placed = lifecycle.place_many(list(decisions.placements), now, {
            place.job_id: RunClass.OPPORTUNISTIC if place.job_class == "opportunistic" else RunClass.GUARANTEED
            for place in decisions.placements})
        preempted = sum(lifecycle.begin_preempt(p.job_id, p.message) for p in decisions.preemptions)
        throttled = _throttle(decisions.throttles)
        queue = _queue(None if decided_on is None else _as_read(decided_on, decisions))
        _store_reservations(decisions, queue.reserved)
        _store_promises(decisions)
        _store_pending_reasons(decisions, queue, now.timestamp())
    return Applied(placed=placed, preempted=preempted, throttled=throttled)


def _throttle(throttles: tuple[Throttle, ...]) -> int:
    """Set each throttled job's duty cycle on its live allocations: one read, one UPDATE per
    distinct duty cycle, and the nodes told after commit. A job whose allocations already run at
    that duty cycle (or that is no longer placed or running) is left alone and told nothing."""
    if not throttles:
        return 0
    duties: dict[int, list[list]] = defaultdict(list)  # job -> [[duty, node], ...] of its live allocations
    for job_id, duty, node in Allocation.objects.filter(
            job_id__in={t.job_id for t in throttles}, released_at__isnull=True, job__state__in=lifecycle.LIVE,
    ).values_list("job_id", "duty_cycle", "gpu__node__name"):
        duties[job_id].append([duty, node])
    final: dict[int, float] = {}
    sends: list[tuple[str, int, float, bool]] = []
    throttled = 0
    for throttle in throttles:
        held = duties.get(throttle.job_id, ())
        if all(duty == throttle.duty_cycle for duty, _ in held):
            continue
        throttled += 1
        was_suspended = any(duty <= 0 for duty, _ in held)
        for allocation in held:
            allocation[0] = throttle.duty_cycle
        final[throttle.job_id] = throttle.duty_cycle
        sends.extend((node, throttle.job_id, throttle.duty_cycle, was_suspended)
                     for node in sorted({node for _, node in held}))
    _store_duty_cycles(final)
    if sends:
        # (one pipeline: a busy cycle changes the duty cycles of a thousand jobs)
        transaction.on_commit(lambda: publish_many([
            command for node, job_id, duty, resume in sends
            for command in duty_cycle_commands(node, job_id, duty, resume=resume)]))
    return throttled


def _store_duty_cycles(final: dict[int, float]) -> None:
    """Each job's live allocations at its new duty cycle. On PostgreSQL one statement for all:
    AIMD leaves about as many distinct duty cycles as jobs it moves (a hundred UPDATEs, most of a
    busy cycle's apply, where live readings keep a thousand jobs moving)."""
    if not final:
        return
    if connection.vendor == "postgresql":
        allocations, jobs = (connection.ops.quote_name(model._meta.db_table) for model in (Allocation, Job))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {allocations} AS allocation SET duty_cycle = wanted.duty "
                "FROM unnest(%s::bigint[], %s::float8[]) AS wanted(job_id, duty), " + jobs + " AS job "
                "WHERE allocation.job_id = wanted.job_id AND job.id = wanted.job_id AND job.state = ANY(%s) "
                "AND allocation.released_at IS NULL AND allocation.duty_cycle <> wanted.duty",
                # (floats all: psycopg refuses a list that mixes ints and floats)
                [list(final), [float(duty) for duty in final.values()], [state.value for state in lifecycle.LIVE]])
        return
    by_duty: dict[float, list[int]] = defaultdict(list)
    for job_id, duty in final.items():
        by_duty[duty].append(job_id)
    for duty, job_ids in by_duty.items():
        Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True,
                                  job__state__in=lifecycle.LIVE).exclude(duty_cycle=duty).update(duty_cycle=duty)


def _store_reservations(decisions: Decisions, reserved: AbstractSet[int]) -> None:
    """``reserved``: the pending jobs whose ``reserved_since`` is set now."""
    global _queue_listed
    held = {r.job_id: r.since for r in decisions.reservations}
    released = reserved - held.keys()
    if released or not held.keys() <= reserved:
        # Pending rows written again by the transaction that listed them keep their version: the
        # listing would not tell the next cycle that they changed.
        _queue_listed = _NOT_LISTED
    if released:
        Job.objects.filter(pk__in=released, state=JobState.PENDING).update(reserved_since=None)
    by_since: dict[float, list[int]] = defaultdict(list)
    for job_id, since in held.items():
        if job_id not in reserved:
            by_since[since].append(job_id)
    for since, job_ids in by_since.items():
        Job.objects.filter(pk__in=job_ids, state=JobState.PENDING, reserved_since__isnull=True).update(
            reserved_since=datetime.fromtimestamp(since, tz=dt_timezone.utc)
        )


def _store_promises(decisions: Decisions) -> None:
    """Keep each promise for the next snapshots (``JobPromise``); delete those the core no longer
    holds (the job was placed, cancelled, or the promise lapsed)."""
    held = {promise.job_id: list(promise.gpu_ids) for promise in decisions.promises}
    stored = dict(JobPromise.objects.values_list("job_id", "gpu_ids"))
    lapsed = stored.keys() - held.keys()
    if lapsed:
        JobPromise.objects.filter(job_id__in=lapsed).delete()
    changed = {job_id: gpu_ids for job_id, gpu_ids in held.items() if stored.get(job_id) != gpu_ids}
    if changed:  # (for jobs still pending: one cancelled since gets none)
        still_pending = Job.objects.filter(pk__in=changed, state=JobState.PENDING).values_list("pk", flat=True)
        JobPromise.objects.bulk_create([JobPromise(job_id=job_id, gpu_ids=changed[job_id]) for job_id in still_pending],
                                       update_conflicts=True, unique_fields=["job"], update_fields=["gpu_ids"])


# ETAs are stored as absolute times rounded to this, so that an estimate that does not move does
# not rewrite the row.
ETA_ROUNDING_S = 30
# A stored ETA that is still this close to the new estimate is kept: queue-aware ETAs of most of a
# long queue move a little whenever a few jobs end, and rewriting 40,000 rows for that was most of
# a cycle's cost. Within max(30 s, 10% of the time still to wait) nobody reads a different answer.
ETA_TOLERANCE_S = 30
ETA_TOLERANCE_SHARE = 0.1
# Rows per UPDATE statement when writing reasons.
REASON_BATCH = 5000


def _eta_at(eta_at: float) -> int:
    return round(eta_at / ETA_ROUNDING_S) * ETA_ROUNDING_S


def _eta_holds(stored, new: int | None, now: float) -> bool:
    if new is None or stored is None:
        return new is None and stored is None
    if not isinstance(stored, (int, float)) or isinstance(stored, bool):
        return False
    return abs(new - stored) <= max(ETA_TOLERANCE_S, ETA_TOLERANCE_SHARE * max(0.0, new - now))


def _canonical(reason: dict) -> str:
    """A reason without its ETA as one comparable string (as it reads back from the database:
    tuples come back as lists)."""
    return json.dumps(json.loads(json.dumps({k: v for k, v in reason.items() if k != "eta_at"})), sort_keys=True)


# PostgreSQL: the pending jobs' listing by row version as ``_queue`` last read it, the pending and
# reserved jobs read with it, and the jobs table's change mark read with it. (The apply's
# transaction writes no pending row before it reads them, and forgets them when it writes one
# after: see ``_store_reservations``.)
_NOT_LISTED: tuple[str | None, frozenset[int], frozenset[int], str | None] = (None, frozenset(), frozenset(), None)
_queue_listed = _NOT_LISTED
# Elsewhere (SQLite): the two tables' change marks and the queue read after them.
_queue_read: tuple[list, "Queue | None"] = ([None, None], None)


# PostgreSQL: the stored verdicts as last read, by row version: only rows written since (by this
# loop or anyone else) are read again; reading 50,000 reasons as text every cycle was a quarter of a
# steady cycle's database time.
_verdict_versions = RowVersions()
# PostgreSQL: where the verdicts others wrote or deleted since the last read are found.
_verdict_feed = VerdictFeed()


@dataclass(frozen=True)
class Queue:
    """The waiting jobs as stored now: which are pending, which hold a reservation, and the stored
    verdicts by job (reason as text, decoded once per distinct text by the caller, and ETA; it may
    hold jobs that are not pending, such as those being preempted)."""

    pending: AbstractSet[int]
    reserved: AbstractSet[int]
    verdicts: dict[int, tuple[str, int | None]]
    # Whether ``pending`` holds every job the decisions tell a verdict (it is the pending jobs of
    # the snapshot they were made on, less those placed: ``_as_read``).
    decided: bool = False


# The pending and reserved jobs of the last snapshot the loop decided on, by that snapshot's
# pending requests (the very tuple, while nothing they are built from changed).
_decided_on: tuple = (None, frozenset(), frozenset())


def _as_read(decided_on: tuple[JobRequest, ...], decisions: Decisions) -> tuple[AbstractSet[int], AbstractSet[int]]:
    """The pending jobs, and those of them holding a reservation, as the snapshot read them, less
    the jobs this cycle placed. A job that left the queue since is told nothing all the same: a
    verdict is written only where the job is pending in the same statement (an update finds no
    verdict of a job placed or ended: the lifecycle dropped it). A job that joined it since waits
    for the next cycle, as it would for the next snapshot. This saves listing 47,000 pending rows
    again in a cycle after a change; unchanged requests keep the very same sets, so a settled
    store stays settled."""
    global _decided_on
    if _decided_on[0] is not decided_on:
        changed = None if _decided_on[0] is None else snapshot_loader.pending_step(_decided_on[0], decided_on)
        if changed is None:
            _decided_on = (decided_on, frozenset(request.id for request in decided_on),
                           frozenset(request.id for request in decided_on if request.reserved_since is not None))
        else:
            # (the last sets with the few requests read again: not a look at each of 200,000, 57 ms)
            now = [request for request in map(partial(_request_of, decided_on), changed) if request is not None]
            pending, reserved = set(_decided_on[1]), set(_decided_on[2])
            pending.difference_update(changed)
            reserved.difference_update(changed)
            pending.update(request.id for request in now)
            reserved.update(request.id for request in now if request.reserved_since is not None)
            _decided_on = (decided_on, pending, reserved)
    _, pending, reserved = _decided_on
    placed = {place.job_id for place in decisions.placements}
    return (pending - placed, reserved - placed) if placed else (pending, reserved)


def _request_of(requests: tuple[JobRequest, ...], job_id: int) -> JobRequest | None:
    """Job ``job_id``'s request among ``requests`` (by job id), found by bisection; None: none."""
    at = bisect_left(requests, job_id, key=_request_id)
    return requests[at] if at < len(requests) and requests[at].id == job_id else None


_request_id = attrgetter("id")


def _queue(as_read: tuple[AbstractSet[int], AbstractSet[int]] | None = None) -> Queue:
    """One read serves both writers. A table whose change mark stays where it was at the last
    read (nothing written to it since: no pending job submitted, placed, cancelled or edited, no
    verdict written) is not read again: most cycles then scan neither the queue nor its verdicts.
    ``as_read``: the pending and reserved jobs the loop's snapshot read (PostgreSQL: then they are
    not listed again)."""
    global _queue_listed, _queue_read
    jobs_mark, waits_mark = now = marks([Job, JobWait])
    if connection.vendor != "postgresql":
        if None not in now and _queue_read[0] == now:
            return _queue_read[1]
        pending, reserved = set(), set()
        for job_id, since in Job.objects.filter(state=JobState.PENDING).order_by().values_list("id", "reserved_since"):
            pending.add(job_id)
            if since is not None:
                reserved.add(job_id)
        queue = Queue(pending, reserved, {
            job_id: (json.dumps(reason), eta_at) for job_id, reason, eta_at in
            JobWait.objects.filter(job__state=JobState.PENDING).values_list("job_id", "reason", "eta_at")})
        _queue_read = (now, queue)  # (marks read before the rows: a write between moves the next ones)
        return queue
    jobs, waits = (connection.ops.quote_name(model._meta.db_table) for model in (Job, JobWait))
    steady = False  # (whether this transaction's scans keep an unchanged table's order yet)
    if as_read is not None:
        pending, reserved = as_read
    elif jobs_mark is None or jobs_mark != _queue_listed[3]:
        # The pending rows by version, with their ids: the same listing as last cycle's means the
        # same pending and reserved jobs, and no 50,000 ids are turned into a set again.
        with connection.cursor() as cursor:
            steady_scan_order(cursor)
            steady = True
            # (texts of ids, not a row per pending job: see row_versions.listing)
            cursor.execute(f"SELECT {LISTED.format(id_column='id')}, string_agg(id::text, ','), "
                           f"string_agg(id::text, ',') FILTER (WHERE reserved_since IS NOT NULL), {mark_sql(Job)} "
                           f"FROM {jobs} WHERE state = %s", [JobState.PENDING.value])
            listed, *ids, jobs_mark = cursor.fetchone()
        if listed != _queue_listed[0] or listed is None:
            pending, reserved = (frozenset(map(int, text.split(","))) if text else frozenset() for text in ids)
        else:
            _, pending, reserved, _ = _queue_listed
        _queue_listed = (listed, pending, reserved, jobs_mark)
    if as_read is None:
        _, pending, reserved, _ = _queue_listed
    verdicts = _verdict_versions.unchanged(waits_mark)
    if verdicts is None:
        def fetch(ids: list[str] | None):
            # (None: every verdict)
            where, params = ("", []) if ids is None else (
                "WHERE job_id = ANY(string_to_array(%s, ',')::bigint[])", [",".join(ids)])
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT job_id, xmin::text, reason_digest, eta_at FROM {waits} {where}", params)
                rows = cursor.fetchall()
                texts = _reason_texts(cursor, waits, {digest for _, _, digest, _ in rows})
            return [(job_id, version, (texts.get(digest), eta_at)) for job_id, version, digest, eta_at in rows]

        if _verdict_versions.never_read:
            token = _verdict_feed.before_full_read()
            verdicts = _verdict_versions.read_every(fetch)  # (a new process's first read)
            _verdict_feed.after_full_read(token)
        else:
            # (what others wrote or deleted since, by index: not a listing of every verdict)
            changes = _verdict_feed.changes(mark_sql(JobWait))
            if changes is not None and not _own_rows(changes.pending, waits_mark):
                verdicts = _verdict_versions.read_changes(changes.pending, changes.left, fetch, changes.mark)
            wrote = waits_mark is None  # (this transaction wrote verdicts: read with its own writes)
            if verdicts is not None:
                _verdict_feed.advance(changes)
            else:
                token = _verdict_feed.before_full_read()
                versions, waits_mark = listing(waits, "job_id", steady=steady, mark=mark_sql(JobWait))
                verdicts = _verdict_versions.read(versions, fetch, waits_mark)
                _verdict_feed.after_full_read(token)
            if wrote:
                # What was kept of its own writes stands only if it commits (a savepoint's rows are
                # not known for its own): rolled back, the next cycle lists.
                held = _verdict_feed.held()
                transaction.on_commit(lambda: _verdict_feed.after_full_read(held if held[0] is not None else None))
    return Queue(pending, reserved, verdicts, as_read is not None)


def _own_rows(items: list[str], mark: str | None) -> bool:
    """Whether any of ``items`` (``id:xmin``) was written by the transaction under way (then only a
    listing tells what it holds: ``RowVersions``). Only a transaction that wrote the table, whose
    mark reads None, can hold one; the apply's own deletes of the placed jobs' verdicts leave none."""
    if mark is not None or not items:
        return False
    own = own_xid()
    return own is not None and any(item.endswith(":" + own) for item in items)


# PostgreSQL: stored reasons as text by their digest (migration 0022), as read from the store. 47,000
# verdicts hold a few hundred distinct reasons: reading each as text cost a new process's first
# cycle 60 ms of PostgreSQL's time (jsonb to text) and 40 of this process's. Dropped whole past
# CANONICAL_CACHE entries.
_text_of_digest: dict[int, str] = {}


def _reason_texts(cursor, table: str, digests: set[int]) -> dict[int, str]:
    """Digest -> reason text of ``digests``, the unknown ones read from one row holding each. A
    digest no row holds any more (rewritten since) is left out: its verdicts read as none stored,
    so that they are written again. (Two reasons of one digest would read as the same reason: a
    chance of about one in 10^10 even among 50,000 distinct reasons.)"""
    unknown = digests.difference(_text_of_digest)
    if unknown:
        if len(_text_of_digest) + len(unknown) > CANONICAL_CACHE:
            _text_of_digest.clear()
            unknown = digests
        cursor.execute(f"SELECT reason_digest, reason::text FROM {table} WHERE job_id = ANY(ARRAY("
                       f"SELECT min(job_id) FROM {table} WHERE reason_digest = ANY(string_to_array(%s, ',')::bigint[]) "
                       "GROUP BY reason_digest))", [",".join(map(str, unknown))])
        _text_of_digest.update(cursor.fetchall())
    return _text_of_digest


def _store_pending_reasons(decisions: Decisions, queue: Queue, now: float) -> None:
    """Write the verdicts that changed, and only those, set-based.

    A verdict changed when its code, message or details differ from the stored ones, or its ETA
    moved beyond the tolerance above. Each distinct reason (and each distinct stored text) is
    encoded once, and the jobs whose verdict is the stored one to the letter are found by C-level
    maps; only the others are looked at one by one. Against a store the last cycle settled (or
    that store with a few rows read again since, none of a job waiting now), only the verdicts
    that differ from that cycle's (and those with an ETA) are compared at all (``_moved_since``).
    """
    global _settled
    if not decisions.pending:
        return
    waiting, verdicts, pending = decisions.pending, queue.verdicts, queue.pending
    settled = _settled
    found = None
    if settled is not None and _store_holds(settled, queue):
        found = _moved_since(settled, waiting, decisions.told_at)
    look = None  # (every verdict)
    kept: dict[int, int] = {}
    if found is not None:
        look, kept = found
        if not look:
            _settled = _Settled(verdicts, _verdict_versions.generation, waiting, kept, frozenset())
            return
    changed, timed, unmatched = _differences(
        waiting if look is None else list(map(waiting.__getitem__, look)), verdicts, pending, now)
    if look is not None:  # (the subset's indexes, back to their places among every verdict)
        timed = {look[index]: at for index, at in timed.items()}
        unmatched = set(map(look.__getitem__, unmatched))
    kept.update(timed)
    settled = _Settled(verdicts, _verdict_versions.generation, waiting, kept, frozenset(unmatched))
    if connection.vendor != "postgresql":
        _settled = None
        _write_reasons(changed)
    elif not changed:
        _settled = settled
    else:
        # Settled once what differed is stored: then every job matches to the letter but those
        # kept within tolerance. Known only when the write commits (``_verdict_versions`` takes the
        # rows then, at a new generation); a cycle rolled back leaves nothing settled.
        _settled = None
        _write_reasons_postgresql(changed, verdicts, settled)


def _store_holds(settled: _Settled, queue: Queue) -> bool:
    """Whether the store holds what it held when ``settled`` was settled, for every job told a
    verdict now: nothing read since, or only rows read again that are of no pending job
    (``RowVersions.delta``: those of jobs placed or cancelled since, dropped with them), where the
    pending jobs are known to hold every job told."""
    if settled.generation == _verdict_versions.generation:
        return settled.verdicts is queue.verdicts
    delta = _verdict_versions.delta
    return (queue.decided and delta is not None and delta[0] == settled.generation
            and queue.pending.isdisjoint(delta[1]))


def _moved_since(settled: _Settled, waiting: tuple, told_at: tuple) -> tuple[list[int], dict[int, int]] | None:
    """Against a store ``settled`` (the last cycle's verdicts, which the store holds), the
    positions among ``waiting`` to compare with the store again, and position -> rounded ETA of
    those with an ETA that still match it; None where the core's hints do not fit the last
    cycle's verdicts (then compare them all).

    A verdict that is the very one told last cycle still matches the store. It is
    looked for where the core says it was told then (``Decisions.told_at``: a queue that lost or
    gained jobs moves the rest of the verdicts), else at the same place; one C-level comparison
    of the two finds the rest, cheaply, because the core hands back the very same verdicts and
    reason objects while their words stay the same (``QueueColumns.told``, ``InternedReasons``),
    so most compare by identity. (Identity is the proof, the hint only where to look: a stale hint
    finds another verdict, and its job is compared.) Another verdict still matches if it has the
    same job, reason object and ETA as the one found there: an ETA is a time, not seconds from
    now, so a guess that holds is the same number. A verdict with an ETA that the store held only
    within tolerance last cycle is compared again every cycle (the tolerance narrows as the time
    comes nearer), and one with another ETA still matches if its rounded time is the one that
    matched the store to the letter."""
    before, timed, unmatched = settled.waiting, settled.timed, settled.unmatched
    then_count, count = len(before), len(waiting)
    if then_count == count and not told_at:
        was_at, found = None, before
    else:
        # (-1, a job new to its queue, finds the last verdict as Python indexes, and is looked
        # up as that position)
        was_at = shared_positions(0, count) if count <= then_count else [*shared_positions(0, then_count),
                                                                          *repeat(-1, count - then_count)]
        for at, then in told_at:
            was_at[at:at + len(then)] = then
        try:
            found = list(map(before.__getitem__, was_at))
        except IndexError:  # (a queue last told in a cycle before the settled one)
            return None
    # Every verdict that did not match the store to the letter is looked at again.
    again_then = set(unmatched)
    if was_at is None:
        again = again_then
    else:
        if then_count - 1 in again_then:
            again_then.add(-1)
        again = set(compress(range(count), map(again_then.__contains__, was_at))) if again_then else set()
    moved = list(set(compress(range(count), map(is_not, found, waiting))).difference(again))
    now_moved, then_moved = list(map(waiting.__getitem__, moved)), list(map(found.__getitem__, moved))
    # (``and_`` of maps: C-level, no tuple a verdict as ``all(zip(...))`` builds; an ETA is a time,
    # so the same time rounds to the same stored one)
    same = map(and_, map(and_, map(eq, map(_first, now_moved), map(_first, then_moved)),
                         map(is_, map(_second, now_moved), map(_second, then_moved))),
               map(eq, map(_third, now_moved), map(_third, then_moved)))
    candidates = sorted(again.union(compress(moved, map(not_, same))))
    # The rounded ETAs of the verdicts that still match, where each is now: the very verdict, or
    # one with its job, reason and time (C-level: 21,000 with an ETA at 197,000 waiting).
    if was_at is None:
        kept = dict(timed)
    else:
        at = list(compress(range(count), map(timed.__contains__, was_at)))
        kept = dict(zip(at, map(timed.__getitem__, map(was_at.__getitem__, at))))
    for candidate in candidates:
        kept.pop(candidate, None)
    then_at = candidates if was_at is None else [at % then_count for at in map(was_at.__getitem__, candidates)]
    now_told, then_told = list(map(waiting.__getitem__, candidates)), list(map(found.__getitem__, candidates))
    etas = list(map(_third, now_told))
    eta_at = {eta: _eta_at(eta) for eta in set(etas) if eta is not None}
    new_at, old_at = list(map(eta_at.get, etas)), list(map(timed.get, then_at))
    same = list(map(and_, map(and_, map(is_not, old_at, repeat(None)), map(eq, new_at, old_at)),
                    map(and_, map(is_, map(_second, now_told), map(_second, then_told)),
                        map(eq, map(_first, now_told), map(_first, then_told)))))
    if unmatched:  # (within tolerance or not stored last cycle: compared with the store again)
        same = list(map(and_, same, map(not_, map(unmatched.__contains__, then_at))))
    kept.update(zip(compress(candidates, same), compress(new_at, same)))
    return list(compress(candidates, map(not_, same))), kept


def _differences(waiting, verdicts: dict, pending: AbstractSet[int],
                 now: float) -> tuple[list[tuple[int, dict, int | None]], dict[int, int], list[int]]:
    """The verdicts of ``waiting`` that differ from the stored ones, as (job, reason, ETA) rows to
    write (jobs no longer pending left out); index -> rounded ETA of those with an ETA; and the
    indexes of those the store is left not holding to the letter: a stored ETA that differs
    within tolerance (kept), or a job no longer pending (not written)."""
    # (a field of every verdict at a time: ``zip(*pending)`` made an iterator of each, 90 ms of
    # the cycle at 200,000 waiting jobs against 15 for these three passes)
    ids, objects, etas = list(map(_first, waiting)), list(map(_second, waiting)), list(map(_third, waiting))
    reason_keys = list(map(id, objects))
    encoded: dict[int, tuple[dict, str]] = {}  # id(reason object) -> (its dict, canonical)
    for key, reason_object in dict(zip(reason_keys, objects)).items():
        reason = reason_object.as_dict()
        encoded[key] = (reason, _canonical_cached(repr(reason), reason))
    # (most of a queue shares a few release times: each distinct ETA is worked out once)
    eta_at = {eta: None if eta is None else _eta_at(eta) for eta in set(etas)}
    new_etas = list(map(eta_at.__getitem__, etas))
    canonical = {key: text for key, (_, text) in encoded.items()}
    new_canonical = list(map(canonical.__getitem__, reason_keys))
    olds = list(map(verdicts.get, ids, repeat(_NO_VERDICT)))
    stored = {text: _canonical_cached(text) for text in set(map(_first, olds)) if text is not None}
    stored[None] = None  # (no verdict stored: never the same)
    old_etas = list(map(_second, olds))
    same = map(all, zip(map(eq, map(stored.__getitem__, map(_first, olds)), new_canonical),
                        map(eq, old_etas, new_etas), map(is_, map(type, old_etas), map(type, new_etas))))
    changed: list[tuple[int, dict, int | None]] = []  # (job, reason, eta_at)
    unmatched: list[int] = []
    for index in compress(range(len(ids)), map(not_, same)):
        job_id = ids[index]
        if job_id not in pending:
            unmatched.append(index)  # (not stored: looked at again, should it be pending again)
            continue  # no longer pending (placed, cancelled) since the snapshot
        if (olds[index] is not _NO_VERDICT and stored[olds[index][0]] == new_canonical[index]
                and _eta_holds(old_etas[index], new_etas[index], now)):
            unmatched.append(index)  # (the same reason, its ETA within tolerance)
            continue
        changed.append((job_id, encoded[id(objects[index])][0], new_etas[index]))
    timed = {index: new_etas[index] for index in compress(range(len(ids)), map(is_not, etas, repeat(None)))}
    return changed, timed, unmatched


@dataclass(frozen=True)
class _Settled:
    """A cycle's verdicts whose store holds them, and what they were compared with: the stored
    verdicts (the very dict ``_verdict_versions`` read, at its generation then), the verdicts
    themselves (``Decisions.pending``), the rounded ETA of each that has one, by its position
    among them, and the positions of those the store does not hold to the letter: an ETA that
    differs within tolerance, or a job no longer pending, not written (every other verdict
    matches the store to the letter)."""

    verdicts: dict
    generation: int
    waiting: tuple
    timed: dict[int, int]
    unmatched: frozenset[int]


# The last cycle's verdicts if it wrote none (``_Settled``): a cycle whose verdicts and store are
# the same is then settled without a look at each of 50,000 jobs.
_settled: _Settled | None = None


_NO_VERDICT = (None, None)
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


# Canonical forms worked out in earlier cycles, of stored texts and of new reasons by their repr
# (most are the same cycle after cycle: ~1,200 JSON round trips a cycle otherwise). Each dropped
# whole past CANONICAL_CACHE entries.
_canonical_of_text: dict[str, str] = {}
_canonical_of_repr: dict[str, str] = {}
CANONICAL_CACHE = 20_000


def _canonical_cached(key: str, reason: dict | None = None) -> str:
    """The canonical form of stored text ``key``, or of ``reason`` whose repr is ``key`` (equal
    reprs, equal reasons)."""
    cache = _canonical_of_text if reason is None else _canonical_of_repr
    found = cache.get(key)
    if found is None:
        if len(cache) >= CANONICAL_CACHE:
            cache.clear()
        found = cache[key] = _canonical_text(key) if reason is None else _canonical(reason)
    return found


def _canonical_text(text: str) -> str:
    decoded = json.loads(text)
    return _canonical(decoded) if isinstance(decoded, dict) else ""


def _write_reasons_postgresql(changed: list[tuple[int, dict, int | None]], stored: dict,
                              settled: _Settled | None = None) -> None:
    """Verdicts a job already has are rewritten in place (``UPDATE``: the table leaves room on its
    pages, so PostgreSQL rewrites such a row without touching the index), new ones inserted, and
    only for jobs still pending. Each batch sends each distinct reason once (a JSON list the rows
    index into) and the rows as comma-separated numbers, which cost nothing to encode (psycopg
    quotes text arrays element by element in Python). The first ETA of a job's first attempt is
    kept in ``first_eta_at`` (what it was promised, see eta_accuracy)."""
    table = connection.ops.quote_name(JobWait._meta.db_table)
    jobs = connection.ops.quote_name(Job._meta.db_table)
    rewrites = [row for row in changed if row[0] in stored]
    additions = [row for row in changed if row[0] not in stored]
    written: list[tuple[int, str, tuple[str, int | None]]] = []
    # (unstamped: every row these statements write is kept as written, see job_feed)
    with loop_writes_verdicts(), connection.cursor() as cursor:
        for batch in _batches(rewrites):
            # A job that left the queue meanwhile lost its row (the lifecycle drops it): no match.
            cursor.execute(
                f"UPDATE {table} AS wait SET reason = reasons.list -> changed.k, eta_at = changed.eta, "
                "first_eta_at = COALESCE(wait.first_eta_at, changed.eta) "
                f"FROM {_CHANGED}, (SELECT %s::jsonb AS list) AS reasons WHERE wait.job_id = changed.id "
                "RETURNING wait.job_id, wait.xmin::text, wait.eta_at",
                [*batch[:3], batch[3]],
            )
            written.extend(_as_written(cursor.fetchall(), batch[4]))
        for batch in _batches(additions):
            cursor.execute(
                f"INSERT INTO {table} AS wait (job_id, reason, eta_at, first_eta_at) "
                "SELECT changed.id, reasons.list -> changed.k, changed.eta, "
                "CASE WHEN job.attempt = 0 THEN changed.eta END "
                f"FROM {_CHANGED} JOIN {jobs} AS job ON job.id = changed.id AND job.state = %s "
                "CROSS JOIN (SELECT %s::jsonb AS list) AS reasons "
                "ON CONFLICT (job_id) DO UPDATE SET reason = EXCLUDED.reason, eta_at = EXCLUDED.eta_at, "
                "first_eta_at = COALESCE(wait.first_eta_at, EXCLUDED.first_eta_at) "
                "RETURNING wait.job_id, wait.xmin::text, wait.eta_at",
                [*batch[:3], JobState.PENDING.value, batch[3]],
            )
            written.extend(_as_written(cursor.fetchall(), batch[4]))
    # Next cycle reads these rows at the version they have now: keep what was written instead of
    # fetching 40,000 reasons back. Only after commit (a rolled-back cycle wrote nothing).
    transaction.on_commit(lambda: _remember(written, settled if len(written) == len(changed) else None))


def _remember(written: list, settled: _Settled | None) -> None:
    global _settled
    before = _verdict_versions.generation
    _verdict_versions.remember(written)
    if settled is not None and settled.generation == before:
        # (the store the verdicts were compared with, and nothing but these rows since)
        _settled = replace(settled, generation=_verdict_versions.generation)


def _as_written(rows, texts: dict[int, str]):
    """(job, version, (reason as JSON text, ETA)) of the rows a statement returned; ``texts``: the
    reason each job was sent."""
    return [(job_id, version, (texts[job_id], eta_at)) for job_id, version, eta_at in rows]


_CHANGED = ("unnest(string_to_array(%s, ',')::bigint[], string_to_array(%s, ',')::int[], "
            "string_to_array(%s, ',', '')::bigint[]) AS changed(id, k, eta)")


def _batches(changed: list[tuple[int, dict, int | None]]):
    """Per REASON_BATCH rows: the ids, reason indexes and ETAs as comma-separated text, the
    distinct reasons as one JSON list, and each job's reason as JSON text."""
    for start in range(0, len(changed), REASON_BATCH):
        index: dict[int, int] = {}
        reasons: list[dict] = []
        ids, keys, etas, pairs = [], [], [], []
        for job_id, reason, eta_at in changed[start:start + REASON_BATCH]:
            key = index.get(id(reason))
            if key is None:
                key = index[id(reason)] = len(reasons)
                reasons.append(reason)
            ids.append(str(job_id))
            keys.append(str(key))
            etas.append("" if eta_at is None else str(eta_at))
            pairs.append((job_id, key))
        texts = [json.dumps(reason) for reason in reasons]
        sent = {job_id: texts[key] for job_id, key in pairs}
        yield ",".join(ids), ",".join(keys), ",".join(etas), "[" + ", ".join(texts) + "]", sent


def _write_reasons(changed: list[tuple[int, dict, int | None]]) -> None:
    """Elsewhere (SQLite in development): the same upsert, row by row in one executemany."""
    attempts: dict[int, int] = {}
    for start in range(0, len(changed), 900):
        chunk = [job_id for job_id, _, _ in changed[start:start + 900]]
        attempts.update(Job.objects.filter(pk__in=chunk, state=JobState.PENDING).values_list("pk", "attempt"))
    texts: dict[int, str] = {}
    rows = []
    for job_id, reason, eta_at in changed:
        if job_id not in attempts:
            continue
        text = texts.get(id(reason))
        if text is None:
            text = texts[id(reason)] = json.dumps(reason)
        rows.append((job_id, text, eta_at, eta_at if attempts[job_id] == 0 else None))
    if not rows:
        return
    table = connection.ops.quote_name(JobWait._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (job_id, reason, eta_at, first_eta_at) VALUES (%s, %s, %s, %s) "
            f"ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, eta_at = excluded.eta_at, "
            f"first_eta_at = COALESCE({table}.first_eta_at, excluded.first_eta_at)", rows)


def resend_after_s() -> float:
    """How long a launch or a stop may go unanswered before it is sent again (settings)."""
    return settings.COLONY_RESEND_AFTER_S


def resend_unstarted_launches(redis_client, as_of: datetime | None = None, skip=()) -> int:
    """Re-send the launch of jobs placed a while ago that never reported started.

    Covers a crash between commit and publish, and a command stream lost with Redis. The agent
    recognises a launch it already applied by its command id, so re-sending is harmless.
    ``as_of``: when the cycle began applying its decisions (the cutoff is counted from then, so a
    slow cycle does not re-send the launches it just sent); ``skip``: the jobs it placed.
    """
    after_s = resend_after_s()
    cutoff = (as_of or timezone.now()) - timezone.timedelta(seconds=after_s)
    jobs = [job for job in Job.objects.filter(state=JobState.PLACED, placed_at__lt=cutoff)
            .select_related(*LAUNCH_RELATED).order_by("pk") if job.pk not in skip]
    if not jobs:
        return 0
    # At most one re-send per job per resend_after_s(), whichever worker gets there first.
    pipe = redis_client.pipeline(transaction=False)
    for job in jobs:
        pipe.set(f"colony:resend:{job.pk}", 1, nx=True, px=max(1, int(after_s * 1000)))
    return sum(bool(send_attempt(job)) for job, claimed in zip(jobs, pipe.execute()) if claimed)


def resend_stops(redis_client) -> int:
    """Re-send the stop of jobs still cancelling or being preempted a while after it was sent.

    A stop lost with Redis (or published by a worker that died after commit) would otherwise
    leave the job holding its GPUs, and a guaranteed job waiting to reclaim them, for ever. The
    agent ignores a stop for a job it does not run, so a duplicate is harmless; a job whose node
    lost it is settled by node health (``requeue_vanished``).
    """
    now = timezone.now().timestamp()
    resent = 0
    # Being stopped, or settled while a node may still run it (timed out by the control plane).
    stopping = set(Job.objects.filter(state__in=lifecycle.STOPPING).values_list("pk", flat=True)) | set(
        Allocation.objects.filter(released_at__isnull=True, job__state__in=TERMINAL_STATES)
        .values_list("job_id", flat=True))
    for job_id in stopping:
        key = f"colony:stopping:{job_id}"
        first_seen = redis_client.get(key)
        if first_seen is None or now - float(first_seen) < resend_after_s():
            if first_seen is None:
                redis_client.set(key, now, ex=STOPPING_MEMORY_S)
            continue
        current = lifecycle.current_launch_id(job_id)
        for node in lifecycle.live_nodes(job_id):
            send_stop(node, job_id, current)
        redis_client.set(key, now, ex=STOPPING_MEMORY_S)
        resent += 1
    return resent


# How long a stopping job's first sighting is remembered (far longer than any stop takes).
STOPPING_MEMORY_S = 24 * 3600
