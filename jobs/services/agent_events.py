"""Agent events (registrations, job started/exited) from the events stream -> database state.

Read through a consumer group so that several workers can share the stream and entries of a
worker that died are claimed by another. Every entry is parsed into a protocol message first;
one that does not parse, or that claims something its node has no business reporting, goes to
the dead-letter stream with a reason. Entries are acknowledged only after their effect is
committed, so a crash re-delivers instead of losing.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime, timezone as dt_timezone

import redis
from django.db import transaction
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.commands import send_stop
from jobs.services.nudge import nudge_scheduler
from monitoring.services.redis_client import get_redis
from monitoring.services.registry import register_node

log = logging.getLogger(__name__)

GROUP = "control-plane"
# An entry delivered to a consumer that has not acked it for this long is claimed by another.
CLAIM_IDLE_MS = 30_000
BATCH = 200


class Rejected(Exception):
    """A well-formed message that must not be applied (reason in the message)."""


def consume_events(client: redis.Redis | None = None, max_batches: int = 50) -> int:
    """Apply what is waiting on the events stream; returns how many entries were handled."""
    client = client or get_redis()
    consumer = f"{socket.gethostname()}-{os.getpid()}"
    _ensure_group(client)
    handled = 0
    _, claimed, _ = client.xautoclaim(protocol.EVENTS_STREAM, GROUP, consumer, CLAIM_IDLE_MS, "0-0", count=BATCH)
    handled += _handle_entries(client, claimed)
    for _ in range(max_batches):
        response = client.xreadgroup(GROUP, consumer, {protocol.EVENTS_STREAM: ">"}, count=BATCH)
        entries = response[0][1] if response else []
        if not entries:
            break
        handled += _handle_entries(client, entries)
    return handled


def _ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(protocol.EVENTS_STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _handle_entries(client: redis.Redis, entries) -> int:
    finished = False
    for entry_id, fields in entries:
        if fields is None:  # trimmed away while pending
            client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
            continue
        try:
            message = protocol.decode_event(fields)
            finished |= apply_event(message)
        except (protocol.ProtocolError, Rejected) as exc:
            dead_letter(client, entry_id, fields, str(exc))
        client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
    if finished:
        nudge_scheduler()
    return len(entries)


def dead_letter(client: redis.Redis, entry_id, fields: dict, reason: str) -> None:
    raw = fields.get(b"m", fields.get("m", b"")) if fields else b""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    log.warning("dead-lettered event %s: %s", entry_id, reason)
    pipe = client.pipeline()
    pipe.xadd(
        protocol.DEAD_LETTER_STREAM,
        {"source": protocol.EVENTS_STREAM, "id": entry_id, "reason": reason[:500], "raw": raw[:1024]},
        maxlen=10_000, approximate=True,
    )
    pipe.incr(protocol.DEAD_LETTER_COUNT_KEY)
    pipe.execute()


def apply_event(message) -> bool:
    """Apply one parsed event; returns True when GPUs were freed (worth a scheduling cycle)."""
    if isinstance(message, protocol.NodeRegistered):
        register_node(message)
        return False
    if isinstance(message, protocol.JobStarted):
        _job_started(message)
        return False
    if isinstance(message, protocol.JobExited):
        return _job_exited(message)
    raise Rejected(f"unhandled event kind {message.kind}")


def _allocated_on(job_id: int, node: str):
    return Allocation.objects.filter(job_id=job_id, gpu__node__name=node)


def _when(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=dt_timezone.utc)


@transaction.atomic
def _job_started(message: protocol.JobStarted) -> None:
    if not _allocated_on(message.job_id, message.node).exists():
        raise Rejected(f"job {message.job_id} was never placed on node {message.node}")
    if Job.objects.filter(pk=message.job_id, state=JobState.PLACED).update(
        state=JobState.RUNNING, started_at=_when(message.started_at)
    ):
        return
    state = Job.objects.values_list("state", flat=True).get(pk=message.job_id)
    if state == JobState.CANCELLING:
        Job.objects.filter(pk=message.job_id, started_at__isnull=True).update(started_at=_when(message.started_at))
    elif state != JobState.RUNNING:
        # The job ended here (or was requeued) but a process started anyway: make it stop.
        transaction.on_commit(lambda: send_stop(message.node, message.job_id))


@transaction.atomic
def _job_exited(message: protocol.JobExited) -> bool:
    live = _allocated_on(message.job_id, message.node).filter(released_at__isnull=True)
    if not _allocated_on(message.job_id, message.node).exists():
        raise Rejected(f"job {message.job_id} was never placed on node {message.node}")
    now = timezone.now()
    outcome = {
        "exit_code": message.exit_code,
        "output_tail": message.output_tail,
        "error": message.error or "",
        "finished_at": _when(message.finished_at),
    }
    Job.objects.filter(pk=message.job_id, state=JobState.CANCELLING).update(state=JobState.CANCELLED, **outcome)
    succeeded = message.exit_code == 0 and message.error is None
    Job.objects.filter(pk=message.job_id, state__in=(JobState.PLACED, JobState.RUNNING)).update(
        state=JobState.SUCCEEDED if succeeded else JobState.FAILED, **outcome
    )
    return live.update(released_at=now) > 0
