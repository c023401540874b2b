"""Alerts that need to know allocations and requests: idle GPUs held by jobs, jobs over their
memory request (XID and thermal alerts are raised by ingest in ``monitoring``); lost nodes that
are back; a growing dead-letter stream; and telling operators about all of them.

Telling operators takes three steps, none of them in the code that raised the alert:

- monitoring's ``alert_opened``/``alert_resolved`` signal: after commit, one ``announce_alerts``
  task is published (nothing else: ingest and the beat tasks never wait on a mail server).
- :func:`announce`: for each operator subscribed to the kind, and each of their channels, a Redis
  key (alert, opened or resolved, user, channel) set only if absent decides "once"; then a send task.
  :func:`announce_recent`, from the beat, runs the same for every alert opened or resolved in the
  last minutes: the keys make it a no-op for those told, and it catches the rest (a broker down at
  commit, a process where the receiver was not connected, the admin's bulk "resolve").
- :func:`deliver`: one message, retried with backoff by ``jobs.tasks.send_alert_notification``.

Not the Notification table: its ``job`` is required, and a node-lost alert has none.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, F, Max, OuterRef, Q, Subquery
from django.dispatch import receiver
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job, NotificationSettings
from jobs.services import notifications
from jobs.services.bulk_rows import ids_in
from jobs.services.enqueue import enqueue
from jobs.services.notifications import EMAIL, WEBHOOK, Message, Refused, TryAgain
from monitoring.choices import AlertKind, NodeHealth, Resolution
from monitoring.models import Alert, Gpu, GpuRollup, JobUsage
from monitoring.services import live
from monitoring.services.alerts import alert_opened, alert_resolved, raise_alert, resolve, resolve_cooled
from agents.streams import dead_letter_count
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

# Rollups must cover this share of the idle window before a GPU is called idle.
MIN_COVERAGE = 0.8

OPENED, RESOLVED = "opened", "resolved"
# Far longer than a send's retries (about 30 min) and the sweep's window.
DEDUPE_TTL_S = 7 * 24 * 3600
DEDUPE_KEY = "colony:alert-notify:{subject}:{phase}:{user_id}:{channel}"
# Short: an operator who subscribes now hears of what opened since, not of last week.
SWEEP_WINDOW = timedelta(minutes=10)
SWEEP_MAX = 500
DEAD_LETTERS_KEY = "colony:alerts:dead-letters"
# Dead letters come in bursts: the "alert" is open from the first new one until none came for this long.
DEAD_LETTERS_QUIET = timedelta(minutes=10)


def evaluate() -> int:
    raised = _idle_gpus() + _memory_over_request()
    client = get_redis()
    # (the live readings, a thousand nodes' samples, are read only while a thermal alert is open)
    resolve_cooled(partial(live.latest_gpus, client), settings.COLONY_ALERT_TEMPERATURE_C)
    _resolve_nodes_back()
    # Telling comes last and never keeps the alerts above from being raised or resolved.
    for step in (partial(watch_dead_letters, client), announce_recent):
        try:
            step()
        except Exception:
            log.exception("alert notifications: %s failed this round", step)
            notifications.count_error()
    return raised


# Every running job's allocation, JobUsage and request is read each evaluation; as rows of values,
# not model instances: 16,000 instances (and their JSON fields) at 1,024 nodes were most of its CPU.


def _idle_gpus() -> int:
    window = timedelta(minutes=settings.COLONY_IDLE_GPU_MINUTES)
    since = timezone.now() - window
    held = list(
        Allocation.objects.filter(released_at__isnull=True, job__state=JobState.RUNNING, created_at__lt=since)
        .values_list("gpu_id", "job_id")
    )
    usage = {
        row["gpu_id"]: row
        for row in GpuRollup.objects.filter(
            gpu_id__in=ids_in({gpu_id for gpu_id, _ in held}), resolution=Resolution.TEN_SECONDS,
            bucket_start__gte=since,
        ).values("gpu_id").annotate(peak=Max("util_max"), buckets=Count("id"))
    } if held else {}
    enough = window.total_seconds() / Resolution.TEN_SECONDS * MIN_COVERAGE
    threshold = settings.COLONY_IDLE_GPU_UTIL_PERCENT
    idle = [(gpu_id, job_id, row["peak"]) for gpu_id, job_id in held
            if (row := usage.get(gpu_id)) and row["buckets"] >= enough and row["peak"] is not None
            and row["peak"] < threshold]
    gpus = Gpu.objects.select_related("node").in_bulk({gpu_id for gpu_id, _, _ in idle})
    idle_now = set()
    for gpu_id, job_id, peak in idle:
        idle_now.add((gpu_id, job_id))
        gpu = gpus[gpu_id]
        raise_alert(
            AlertKind.IDLE_GPU, node_id=gpu.node_id, gpu_id=gpu_id, job_id=job_id,
            message=(f"{gpu} held by job {job_id} under {threshold:.0f}% utilisation "
                     f"for {settings.COLONY_IDLE_GPU_MINUTES:.0f} min"),
            details={"peak_util": peak},
        )
    for pk, gpu_id, job_id in Alert.objects.filter(kind=AlertKind.IDLE_GPU, resolved_at__isnull=True).values_list(
            "pk", "gpu_id", "job_id"):
        if (gpu_id, job_id) not in idle_now:
            resolve(AlertKind.IDLE_GPU, pk=pk)
    return len(idle_now)


def _memory_over_request() -> int:
    # Only the jobs over their request come back (JobUsage is keyed by job id, not joined to it).
    requested = Job.objects.filter(pk=OuterRef("job_id"), state=JobState.RUNNING, gpu_memory_mib__isnull=False)
    over = list(
        JobUsage.objects.annotate(requested=Subquery(requested.values("gpu_memory_mib")[:1]))
        .filter(requested__isnull=False, peak_gpu_memory_mib__gt=F("requested"))
        .values_list("job_id", "peak_gpu_memory_mib", "requested")
    )
    if not over:
        return 0
    node_of: dict[int, int] = {}
    # (each job's first live allocation, as ``first()`` picks it: by primary key)
    for job_id, node_id in (Allocation.objects.filter(job_id__in=ids_in({job_id for job_id, _, _ in over}),
                                                      released_at__isnull=True)
                            .order_by("pk").values_list("job_id", "gpu__node_id")):
        node_of.setdefault(job_id, node_id)
    raised = 0
    for job_id, peak, request in over:
        if job_id not in node_of:
            continue
        raise_alert(
            AlertKind.MEMORY_OVER_REQUEST, node_id=node_of[job_id], job_id=job_id,
            message=(f"Job {job_id} uses {peak} MiB per GPU, "
                     f"more than the {request} MiB it asked for"),
            details={"peak_mib": peak, "requested_mib": request},
        )
        raised += 1
    return raised


def _resolve_nodes_back() -> int:
    # A lost node comes back by re-registering or heartbeating again; either way it is UP.
    back = list(Alert.objects.filter(kind=AlertKind.NODE_LOST, resolved_at__isnull=True, node__state=NodeHealth.UP)
                .values_list("pk", flat=True))
    return resolve(AlertKind.NODE_LOST, pk__in=back) if back else 0


# ---------------------------------------------------------------- telling operators


@receiver(alert_opened, dispatch_uid="jobs.alerts.opened")
def _on_opened(sender, alert_ids, **kwargs) -> None:
    transaction.on_commit(partial(_publish_announce, list(alert_ids), OPENED))


@receiver(alert_resolved, dispatch_uid="jobs.alerts.resolved")
def _on_resolved(sender, alert_ids, **kwargs) -> None:
    transaction.on_commit(partial(_publish_announce, list(alert_ids), RESOLVED))


def _publish_announce(alert_ids: list[int], phase: str) -> None:
    try:
        # No publish retries: with the broker down they would stall ingest; the sweep catches up.
        enqueue("announce_alerts", alert_ids, phase, retry=False)
    except Exception as exc:
        log.warning("could not enqueue the announcement of alerts %s (%s): %s", alert_ids, phase, exc)
        notifications.count_error()


def announce(alert_ids: list[int], phase: str) -> int:
    """Queue one message per subscribed operator and channel for each alert, unless queued before;
    returns how many were queued."""
    alerts = Alert.objects.filter(pk__in=alert_ids).select_related("node", "gpu")
    if phase == RESOLVED:
        alerts = alerts.filter(resolved_at__isnull=False)
    return _fan_out([(f"alert{alert.pk}", f"{notifications.ALERT_PREFIX}{alert.kind}", partial(render, alert, phase))
                     for alert in alerts], phase)


def announce_recent(now=None) -> int:
    since = (now or timezone.now()) - SWEEP_WINDOW
    queued = 0
    for phase, recent in ((OPENED, Q(opened_at__gte=since)), (RESOLVED, Q(resolved_at__gte=since))):
        ids = list(Alert.objects.filter(recent).order_by("-pk").values_list("pk", flat=True)[:SWEEP_MAX])
        queued += announce(ids, phase) if ids else 0
    return queued


def _fan_out(subjects: list, phase: str) -> int:
    """``subjects``: (name for the dedupe key, event opted in to, a callable rendering the Message)."""
    subscribed = _subscribed_operators()
    if not subscribed:
        return 0
    client = get_redis()
    queued = 0
    for subject, event, render_message in subjects:
        message = None
        for user_id, channels, events in subscribed:
            if event not in events:
                continue
            for channel in channels:
                key = DEDUPE_KEY.format(subject=subject, phase=phase, user_id=user_id, channel=channel)
                if not client.set(key, "queued", nx=True, ex=DEDUPE_TTL_S):
                    continue  # told already, or being told
                message = message or dataclasses.asdict(render_message())
                try:
                    enqueue("send_alert_notification", key, user_id, channel, event, message, retry=False)
                except Exception as exc:
                    client.delete(key)  # so the next sweep tries again
                    log.warning("could not enqueue alert message %s: %s", key, exc)
                    notifications.count_error()
                else:
                    queued += 1
    return queued


def _subscribed_operators() -> list[tuple[int, list[str], set[str]]]:
    rows = (NotificationSettings.objects.filter(notifications.operators("user__"))
            .filter(Q(email=True) | ~Q(webhook_url=""))
            .values_list("user_id", "email", "webhook_url", "events"))
    subscribed = []
    for user_id, email, webhook_url, events in rows:
        alert_events = {event for event in events or [] if event.startswith(notifications.ALERT_PREFIX)}
        if alert_events:
            subscribed.append((user_id, [c for c, on in ((EMAIL, email), (WEBHOOK, webhook_url)) if on], alert_events))
    return subscribed


def deliver(dedupe_key: str, user_id: int, channel: str, event: str, message: dict, last_try: bool) -> str:
    """Send one alert message; ``sent``, ``failed`` or ``skipped``. Raises :class:`TryAgain` for a
    failure that may pass, unless ``last_try``. Who may hear it is checked again now: someone no
    longer an operator, or no longer subscribed, is told nothing."""
    client = get_redis()
    if client.get(dedupe_key) not in (None, b"queued"):
        return "skipped"  # the task ran twice; its first run already sent or gave up
    try:
        user = get_user_model().objects.filter(pk=user_id).first()
        prefs = NotificationSettings.objects.filter(user_id=user_id).first()
        if user is None or not notifications.is_operator(user):
            raise Refused("Only operators hear about cluster alerts.")
        if prefs is None or event not in (prefs.events or []):
            raise Refused("Unsubscribed from this alert before the message went out.")
        notifications.send_on_channel(user, prefs, channel, Message(**message))
    except Refused as exc:
        return _give_up(client, dedupe_key, str(exc))
    except Exception as exc:
        if not isinstance(exc, TryAgain):
            log.exception("alert message %s could not be sent", dedupe_key)
            exc = TryAgain(f"Internal error: {exc}")
        if last_try:
            return _give_up(client, dedupe_key, str(exc))
        raise exc
    client.set(dedupe_key, "sent", ex=DEDUPE_TTL_S)
    return "sent"


def _give_up(client, dedupe_key: str, why: str) -> str:
    log.warning("alert message %s gave up: %s", dedupe_key, why)
    client.set(dedupe_key, "failed", ex=DEDUPE_TTL_S)
    notifications.count_error()
    return "failed"


def render(alert: Alert, phase: str) -> Message:
    what = " ".join(alert.message.split())[:200]  # no newline may reach a mail header
    details = [f"Kind: {alert.get_kind_display()}", f"Node: {alert.node.name}"]
    if alert.gpu_id:
        details.append(f"GPU: {alert.node.name}/gpu{alert.gpu.index}")
    if alert.job_id:
        details.append(f"Job: {alert.job_id}")
    details.append(f"Opened: {alert.opened_at:%Y-%m-%d %H:%M:%S %Z}")
    if phase == RESOLVED and alert.resolved_at:
        minutes = max(1, round((alert.resolved_at - alert.opened_at).total_seconds() / 60))
        details.append(f"Resolved: {alert.resolved_at:%Y-%m-%d %H:%M:%S %Z}, open {minutes} min")
    return Message(title=f"{'resolved' if phase == RESOLVED else 'alert'}: {what}",
                   url=notifications.public_url("admin:monitoring_alert_change", alert.pk), details=details, output="")


def watch_dead_letters(client, now=None) -> str | None:
    """Open a dead-letter "alert" when the stream grows, resolve it after a quiet spell; returns
    ``opened``, ``resolved`` or None. No Alert row (those name a node); its state is in Redis."""
    # Two evaluations overlapping would both see the growth and open two episodes.
    if not client.set(f"{DEAD_LETTERS_KEY}:lock", 1, nx=True, ex=60):
        return None
    try:
        return _watch_dead_letters(client, now)
    finally:
        client.delete(f"{DEAD_LETTERS_KEY}:lock")


def _watch_dead_letters(client, now) -> str | None:
    now_s = (now or timezone.now()).timestamp()
    count = dead_letter_count(client)
    state = {k.decode(): v.decode() for k, v in client.hgetall(DEAD_LETTERS_KEY).items()}
    if "seen" not in state:  # the first look: what piled up before is history, not news
        client.hset(DEAD_LETTERS_KEY, "seen", count)
        return None
    seen, update, outcome = int(state["seen"]), {"seen": count}, None
    if count > seen:
        update["grew_at"] = now_s
        if "opened_at" not in state:
            update.update(opened_at=now_s, opened_count=seen)
            state.update(opened_at=str(now_s), opened_count=str(seen))
            outcome = OPENED
    elif "opened_at" in state and now_s - float(state["grew_at"]) >= DEAD_LETTERS_QUIET.total_seconds():
        outcome = RESOLVED
    client.hset(DEAD_LETTERS_KEY, mapping=update)
    if outcome == RESOLVED:
        client.hdel(DEAD_LETTERS_KEY, "opened_at", "opened_count", "grew_at")
    if outcome:
        episode = f"dead-letters{int(float(state['opened_at']))}"
        _fan_out([(episode, notifications.DEAD_LETTERS,
                   partial(_render_dead_letters, client, outcome, count - int(state["opened_count"])))], outcome)
    return outcome


def _render_dead_letters(client, phase: str, how_many: int) -> Message:
    details = [f"Dead-lettered since this began: {how_many} (all time: {dead_letter_count(client)})"]
    for _, fields in client.xrevrange(protocol.DEAD_LETTER_STREAM, count=1):
        fields = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items() if k != b"raw"}
        details.append(f"Latest: from {fields.get('source', '?')}: {fields.get('reason', '')[:300]}")
    quiet = int(DEAD_LETTERS_QUIET.total_seconds() // 60)
    title = (f"resolved: no message dead-lettered for {quiet} min" if phase == RESOLVED
             else "alert: messages are being dead-lettered")
    return Message(title=title, url=notifications.public_url("home"), details=details, output="")
