"""Carry out the core's decisions: one transaction, conditional updates, commands after commit.

Job state changes go through :mod:`jobs.services.lifecycle`, each conditional on the state the
core saw: a job cancelled between snapshot and apply is simply skipped. Redis commands are published in
``on_commit``, so a rolled-back cycle sends nothing; a crash after commit but before publish
leaves a PLACED job whose launch is re-sent by ``resend_unstarted_launches``, and a stop lost the
same way is re-sent by ``resend_stops``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

from django.db import connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from jobs.choices import TERMINAL_STATES, RunClass, JobState
from jobs.models import Allocation, Job
from jobs.scheduling import Decisions
from jobs.scheduling.decisions import Throttle
from jobs.services import lifecycle
from jobs.services.commands import send_duty_cycle, send_stop
from jobs.services.launches import send_attempt


@dataclass(frozen=True)
class Applied:
    placed: int = 0
    preempted: int = 0
    throttled: int = 0


def apply_decisions(decisions: Decisions) -> Applied:
    now = timezone.now()
    with transaction.atomic():
        placed = lifecycle.place_many(list(decisions.placements), now, {
            place.job_id: RunClass.OPPORTUNISTIC if place.job_class == "opportunistic" else RunClass.GUARANTEED
            for place in decisions.placements})
        preempted = sum(lifecycle.begin_preempt(p.job_id, p.message) for p in decisions.preemptions)
        throttled = _throttle(decisions.throttles)
        queue = _queue()
        _store_reservations(decisions, {job_id for job_id, (_, reserved) in queue.items() if reserved})
        _store_pending_reasons(decisions, {job_id: text for job_id, (text, _) in queue.items()}, now.timestamp())
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
    by_duty: dict[float, list[int]] = defaultdict(list)
    for job_id, duty in final.items():
        by_duty[duty].append(job_id)
    for duty, job_ids in by_duty.items():
        Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True,
                                  job__state__in=lifecycle.LIVE).exclude(duty_cycle=duty).update(duty_cycle=duty)
    if sends:
        transaction.on_commit(lambda: [send_duty_cycle(node, job_id, duty, resume=resume)
                                       for node, job_id, duty, resume in sends])
    return throttled


def _store_reservations(decisions: Decisions, reserved: set[int]) -> None:
    """``reserved``: the pending jobs whose ``reserved_since`` is set now."""
    held = {r.job_id: r.since for r in decisions.reservations}
    released = reserved - held.keys()
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


def _eta_at(eta_s: float, now: float) -> int:
    return round((now + eta_s) / ETA_ROUNDING_S) * ETA_ROUNDING_S


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


# PostgreSQL: each pending job's row version (its ``xmin``) and stored reason text as last read by
# this process. A row whose version is unchanged still holds that text, so only rows written since
# (by this loop or anyone else) have their reason read again: reading 50,000 reasons as text every
# cycle was a quarter of a steady cycle's database time. Replaced by the queue on every read.
_seen: dict[int, tuple[str, str | None]] = {}


def _queue() -> dict[int, tuple[str | None, bool]]:
    """Every pending job as it is stored now: its reason as text (decoded once per distinct text
    by the caller) and whether it holds a reservation. One read serves both writers."""
    global _seen
    pending = Job.objects.filter(state=JobState.PENDING).order_by()
    if connection.vendor != "postgresql":
        return {job_id: (text, reserved) for job_id, text, reserved in (
            pending.annotate(reason_text=Cast("pending_reason", TextField()),
                             reserved=ExpressionWrapper(Q(reserved_since__isnull=False), output_field=BooleanField()))
            .values_list("id", "reason_text", "reserved"))}
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, xmin::text, reserved_since IS NOT NULL FROM {table} WHERE state = %s",
                       [JobState.PENDING.value])
        versions = cursor.fetchall()
        stale = [str(job_id) for job_id, version, _ in versions if _seen.get(job_id, ("",))[0] != version]
        read = {}
        if stale:
            # Version and text from one statement, so they always belong together.
            cursor.execute(f"SELECT id, xmin::text, pending_reason::text FROM {table} "
                           "WHERE id = ANY(string_to_array(%s, ',')::bigint[]) AND state = %s",
                           [",".join(stale), JobState.PENDING.value])
            read = {job_id: (version, text) for job_id, version, text in cursor.fetchall()}
    seen, queue = {}, {}
    for job_id, version, reserved in versions:
        known = read.get(job_id) or _seen.get(job_id)
        if known is None:
            continue  # left the queue between the two reads
        seen[job_id] = known
        queue[job_id] = (known[1], reserved)
    _seen = seen
    return queue


def _store_pending_reasons(decisions: Decisions, texts: dict[int, str | None], now: float) -> None:
    """Write the reasons that changed, and only those, set-based.

    ``texts``: each pending job's stored reason as text. A reason changed when its code, message or
    details differ from the stored ones, or its ETA moved beyond the tolerance above. The core
    shares one reason object among every job that waits for the same thing, so each distinct
    reason (and each distinct stored text) is encoded once.
    """
    if not decisions.pending:
        return
    stored: dict[str, tuple[str, object]] = {}  # stored text -> (canonical reason, eta_at)
    current: dict[int, tuple[str, object] | None] = {}
    for job_id, text in texts.items():
        if text is None:
            current[job_id] = None
            continue
        seen = stored.get(text)
        if seen is None:
            decoded = json.loads(text)
            seen = stored[text] = ((_canonical(decoded), decoded.get("eta_at")) if isinstance(decoded, dict)
                                   else ("", None))
        current[job_id] = seen
    encoded: dict[int, tuple[dict, str]] = {}  # id(reason object) -> (its dict, canonical)
    changed: list[tuple[int, dict, int | None]] = []  # (job, reason without ETA, eta_at)
    for pending in decisions.pending:
        if pending.job_id not in current:
            continue  # no longer pending (placed, cancelled) since the snapshot
        new = encoded.get(id(pending.reason))
        if new is None:
            reason = pending.reason.as_dict()
            new = encoded[id(pending.reason)] = (reason, _canonical(reason))
        eta_at = None if pending.eta_s is None else _eta_at(pending.eta_s, now)
        old = current[pending.job_id]
        if old is not None and old[0] == new[1] and _eta_holds(old[1], eta_at, now):
            continue
        changed.append((pending.job_id, new[0], eta_at))
    if connection.vendor == "postgresql":
        _write_reasons_postgresql(changed)
    else:
        _write_reasons(changed)


def _with_eta(reason: dict, eta_at: int | None) -> dict:
    return reason if eta_at is None else {**reason, "eta_at": eta_at}


def _write_reasons_postgresql(changed: list[tuple[int, dict, int | None]]) -> None:
    """One UPDATE per batch: each distinct reason is sent once (a JSON list the rows index into)
    and the rows as comma-separated numbers, which cost nothing to encode (psycopg quotes text
    arrays element by element in Python). The first ETA a job is given is kept in ``eta_first_at``
    (what it was promised, see eta_accuracy) by the same statement."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        for start in range(0, len(changed), REASON_BATCH):
            index: dict[int, int] = {}
            reasons: list[dict] = []
            ids, keys, etas = [], [], []
            for job_id, reason, eta_at in changed[start:start + REASON_BATCH]:
                key = index.get(id(reason))
                if key is None:
                    key = index[id(reason)] = len(reasons)
                    reasons.append(reason)
                ids.append(str(job_id))
                keys.append(str(key))
                etas.append("" if eta_at is None else str(eta_at))
            cursor.execute(
                f"UPDATE {table} AS job SET "
                "pending_reason = CASE WHEN changed.eta IS NULL THEN reasons.list -> changed.k "
                "ELSE (reasons.list -> changed.k) || jsonb_build_object('eta_at', changed.eta) END, "
                "eta_first_at = COALESCE(job.eta_first_at, CASE WHEN job.attempt = 0 THEN to_timestamp(changed.eta) END) "
                "FROM unnest(string_to_array(%s, ',')::bigint[], string_to_array(%s, ',')::int[], "
                "string_to_array(%s, ',', '')::bigint[]) AS changed(id, k, eta), "
                "(SELECT %s::jsonb AS list) AS reasons "
                "WHERE job.id = changed.id AND job.state = %s",
                [",".join(ids), ",".join(keys), ",".join(etas), json.dumps(reasons), JobState.PENDING.value],
            )


def _write_reasons(changed: list[tuple[int, dict, int | None]]) -> None:
    """Elsewhere (SQLite in development): one UPDATE per distinct reason."""
    by_text: dict[str, list[int]] = defaultdict(list)
    reasons: dict[str, dict] = {}
    for job_id, reason, eta_at in changed:
        reason = _with_eta(reason, eta_at)
        key = json.dumps(reason, sort_keys=True)
        reasons[key] = reason
        by_text[key].append(job_id)
    for key, job_ids in by_text.items():
        first_eta = _as_datetime(reasons[key].get("eta_at"))
        for start in range(0, len(job_ids), 1000):
            chunk = job_ids[start:start + 1000]
            Job.objects.filter(pk__in=chunk, state=JobState.PENDING).update(pending_reason=reasons[key])
            if first_eta is not None:
                # What the job was first promised, kept to measure ETAs against (see eta_accuracy).
                Job.objects.filter(pk__in=chunk, state=JobState.PENDING, attempt=0,
                                   eta_first_at__isnull=True).update(eta_first_at=first_eta)


def _as_datetime(unix) -> datetime | None:
    if not isinstance(unix, (int, float)) or isinstance(unix, bool):
        return None
    return datetime.fromtimestamp(unix, tz=dt_timezone.utc)


RESEND_AFTER_S = 15


def resend_unstarted_launches(redis_client, as_of: datetime | None = None, skip=()) -> int:
    """Re-send the launch of jobs placed a while ago that never reported started.

    Covers a crash between commit and publish, and a command stream lost with Redis. The agent
    recognises a launch it already applied by its command id, so re-sending is harmless.
    ``as_of``: when the cycle began applying its decisions (the cutoff is counted from then, so a
    slow cycle does not re-send the launches it just sent); ``skip``: the jobs it placed.
    """
    cutoff = (as_of or timezone.now()) - timezone.timedelta(seconds=RESEND_AFTER_S)
    jobs = [job for job in Job.objects.filter(state=JobState.PLACED, placed_at__lt=cutoff)
            .select_related("tenant").order_by("pk") if job.pk not in skip]
    if not jobs:
        return 0
    # At most one re-send per job per RESEND_AFTER_S, whichever worker gets there first.
    pipe = redis_client.pipeline(transaction=False)
    for job in jobs:
        pipe.set(f"colony:resend:{job.pk}", 1, nx=True, ex=RESEND_AFTER_S)
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
        if first_seen is None or now - float(first_seen) < RESEND_AFTER_S:
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
