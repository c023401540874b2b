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

from django.db import transaction
from django.utils import timezone

from jobs.choices import TERMINAL_STATES, JobClass, JobState
from jobs.models import Allocation, Job
from jobs.scheduling import Decisions
from jobs.scheduling.decisions import Place
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
        placed = sum(_place(place, now) for place in decisions.placements)
        preempted = sum(lifecycle.begin_preempt(p.job_id, p.message) for p in decisions.preemptions)
        throttled = sum(_throttle(t.job_id, t.duty_cycle) for t in decisions.throttles)
        _store_reservations(decisions)
        _store_pending_reasons(decisions, now.timestamp())
    return Applied(placed=placed, preempted=preempted, throttled=throttled)


def _place(place: Place, now: datetime) -> bool:
    job_class = JobClass.OPPORTUNISTIC if place.job_class == "opportunistic" else JobClass.GUARANTEED
    return lifecycle.place(place, now, job_class)


def _throttle(job_id: int, duty_cycle: float) -> bool:
    live = Allocation.objects.filter(job_id=job_id, released_at__isnull=True,
                                     job__state__in=(JobState.PLACED, JobState.RUNNING))
    was_suspended = live.filter(duty_cycle__lte=0).exists()
    if not live.exclude(duty_cycle=duty_cycle).update(duty_cycle=duty_cycle):
        return False
    for node in lifecycle.live_nodes(job_id):
        transaction.on_commit(lambda node=node: send_duty_cycle(node, job_id, duty_cycle, resume=was_suspended))
    return True


def _store_reservations(decisions: Decisions) -> None:
    held = {r.job_id: r.since for r in decisions.reservations}
    Job.objects.filter(state=JobState.PENDING, reserved_since__isnull=False).exclude(pk__in=held).update(
        reserved_since=None
    )
    for job_id, since in held.items():
        Job.objects.filter(pk=job_id, state=JobState.PENDING, reserved_since__isnull=True).update(
            reserved_since=datetime.fromtimestamp(since, tz=dt_timezone.utc)
        )


# ETAs are stored as absolute times rounded to this, so that an estimate that does not move does
# not rewrite 50,000 rows every cycle.
ETA_ROUNDING_S = 30


def _reason(pending, now: float) -> dict:
    reason = pending.reason.as_dict()
    if pending.eta_s is not None:
        reason["eta_at"] = round((now + pending.eta_s) / ETA_ROUNDING_S) * ETA_ROUNDING_S
    return reason


def _store_pending_reasons(decisions: Decisions, now: float) -> None:
    """Write reasons that changed, one UPDATE per distinct reason.

    Thousands of pending jobs share a few dozen distinct reasons ("tenant at its ceiling", "waiting
    for 8 free GPUs"), so this is a handful of statements rather than a row-by-row bulk update.
    """
    reasons = {pending.job_id: _reason(pending, now) for pending in decisions.pending}
    if not reasons:
        return
    current = dict(Job.objects.filter(state=JobState.PENDING).values_list("id", "pending_reason"))
    changed: dict[str, list[int]] = defaultdict(list)
    texts: dict[str, dict] = {}
    for job_id, reason in reasons.items():
        if job_id in current and current[job_id] != reason:
            key = json.dumps(reason, sort_keys=True)
            texts[key] = reason
            changed[key].append(job_id)
    for key, job_ids in changed.items():
        first_eta = _as_datetime(texts[key].get("eta_at"))
        for start in range(0, len(job_ids), 1000):
            chunk = job_ids[start:start + 1000]
            Job.objects.filter(pk__in=chunk, state=JobState.PENDING).update(pending_reason=texts[key])
            if first_eta is not None:
                # What the job was first promised, kept to measure ETAs against (see eta_accuracy).
                Job.objects.filter(pk__in=chunk, state=JobState.PENDING, attempt=0,
                                   eta_first_at__isnull=True).update(eta_first_at=first_eta)


def _as_datetime(unix) -> datetime | None:
    if not isinstance(unix, (int, float)) or isinstance(unix, bool):
        return None
    return datetime.fromtimestamp(unix, tz=dt_timezone.utc)


RESEND_AFTER_S = 15


def resend_unstarted_launches(redis_client) -> int:
    """Re-send the launch of jobs placed a while ago that never reported started.

    Covers a crash between commit and publish, and a command stream lost with Redis. The agent
    recognises a launch it already applied by its command id, so re-sending is harmless.
    """
    cutoff = timezone.now() - timezone.timedelta(seconds=RESEND_AFTER_S)
    resent = 0
    for job in Job.objects.filter(state=JobState.PLACED, placed_at__lt=cutoff).select_related("tenant"):
        if redis_client.set(f"colony:resend:{job.pk}", 1, nx=True, ex=RESEND_AFTER_S):
            resent += bool(send_attempt(job))
    return resent


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
