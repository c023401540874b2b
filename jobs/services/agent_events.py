"""Agent events (registrations, job started/exited) from the events stream -> database state.

Read through a consumer group so that several workers can share the stream and entries of a
worker that died are claimed by another. Every entry is parsed into a protocol message first;
one that does not parse, is not signed by the node it names (when agent authentication is
required), or claims something its node has no business reporting, goes to the dead-letter
stream with a reason. Entries are acknowledged only after their effect is
committed, so a crash re-delivers instead of losing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone as dt_timezone

import redis
from django.db import transaction

from agents import protocol
from agents.streams import dead_letter, drain
from jobs.services import lifecycle
from jobs.services.node_health import held_jobs, resend_duty_cycles, stop_strays
from jobs.services.nudge import nudge_scheduler
from monitoring.services.fanin import fan_in
from monitoring.services.poison import PoisonCounter, parse_or_dead_letter
from monitoring.services.redis_client import get_redis
from monitoring.services.registry import ForeignGpus, agent_auth_required, register_node

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
    fan_in(client, "events")
    return drain(client, protocol.EVENTS_STREAM, GROUP, _handle_entries, batch=BATCH, max_batches=max_batches,
                 claim_idle_ms=CLAIM_IDLE_MS)


def _handle_entries(client: redis.Redis, entries) -> int:
    """Apply ``entries`` in order, each in its own transaction. One that does not parse or is
    :class:`Rejected` is dead-lettered at once; one that fails to apply for any other reason than
    an outage (poison: a data error, a bug its content trips) is tried again up to
    ``poison.MAX_TRIES`` times and then dead-lettered, never holding up the entries behind it.
    An outage (database or Redis gone) propagates, leaving the entry unacked for later."""
    finished = False
    auth_required = agent_auth_required()
    poison = PoisonCounter(client, protocol.EVENTS_STREAM, GROUP)
    for entry_id, fields in entries:
        if fields is None:  # trimmed away while pending
            client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
            continue
        message = parse_or_dead_letter(client, protocol.EVENTS_STREAM, entry_id, fields, protocol.decode_event,
                                       auth_required)
        if message is None:
            client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
            continue

        def attempt(message=message):
            try:
                with transaction.atomic():
                    return apply_event(message)
            except Rejected as exc:  # refused on purpose: no point trying again
                return exc

        applied, outcome = poison.apply(entry_id, fields, attempt)
        if not applied:
            continue  # dead-lettered (and acked) after its tries
        if isinstance(outcome, Rejected):
            dead_letter(client, protocol.EVENTS_STREAM, entry_id, fields, str(outcome))
        else:
            finished |= bool(outcome)
        client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
    if finished:
        nudge_scheduler()
    return len(entries)


def apply_event(message) -> bool:
    """Apply one parsed event; returns True when GPUs were freed (worth a scheduling cycle).
    Raises :class:`Rejected` for a report its node has no business making."""
    try:
        if isinstance(message, protocol.NodeRegistered):
            # A lost node still running jobs it no longer holds stays LOST until they stopped.
            strays = set(message.running_jobs) - held_jobs([message.node])[message.node]
            register_node(message, revive=not strays)
            if message.running_jobs:
                stop_strays(get_redis(), message.node, message.running_jobs)
                resend_duty_cycles(message.node, message.running_jobs)
            return False
        if isinstance(message, protocol.JobStarted):
            lifecycle.start(message.job_id, message.node, message.launch_id, _when(message.started_at))
            return False
        if isinstance(message, protocol.CommandRejected):
            dead_letter(get_redis(), protocol.command_stream(message.node), message.entry_id, None,
                        f"refused by node {message.node}: {message.reason}")
            return False
        if isinstance(message, protocol.JobExited):
            return lifecycle.finish(message.job_id, lifecycle.Exit(
                node=message.node, launch_id=message.launch_id, exit_code=message.exit_code,
                finished_at=_when(message.finished_at), error=message.error, output_tail=message.output_tail,
                oom=message.oom, timed_out=message.timed_out, requeue=message.requeue, absent=message.absent,
                stopped=message.stopped,
                requeue_cause=message.requeue_cause,
            ))
    except (lifecycle.ForeignReport, ForeignGpus) as exc:
        raise Rejected(str(exc)) from None
    raise Rejected(f"unhandled event kind {message.kind}")


def _when(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=dt_timezone.utc)
