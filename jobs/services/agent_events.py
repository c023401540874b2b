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
from django.db.models import F
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.commands import launch_id, send_stop
from jobs.services.node_health import resend_duty_cycles, stop_strays
from jobs.services.profiles import record_profile
from jobs.services.nudge import nudge_scheduler
from monitoring.models import JobUsage
from monitoring.services.dead_letters import dead_letter
from monitoring.services.redis_client import get_redis
from monitoring.services.registry import agent_auth_required, authenticate, register_node
from monitoring.services.streams import claim_stale, consumer_name, ensure_group, read_new

log = logging.getLogger(__name__)

AGENT_RESTARTED = "agent_restarted"

GROUP = "control-plane"
# An entry delivered to a consumer that has not acked it for this long is claimed by another.
CLAIM_IDLE_MS = 30_000
BATCH = 200


class Rejected(Exception):
    """A well-formed message that must not be applied (reason in the message)."""


def consume_events(client: redis.Redis | None = None, max_batches: int = 50) -> int:
    """Apply what is waiting on the events stream; returns how many entries were handled."""
    client = client or get_redis()
    consumer = consumer_name()
    ensure_group(client, protocol.EVENTS_STREAM, GROUP)
    handled = _handle_entries(client, claim_stale(client, protocol.EVENTS_STREAM, GROUP, consumer, CLAIM_IDLE_MS))
    for _ in range(max_batches):
        entries = read_new(client, protocol.EVENTS_STREAM, GROUP, consumer, BATCH)
        if not entries:
            break
        handled += _handle_entries(client, entries)
    return handled


def _handle_entries(client: redis.Redis, entries) -> int:
    finished = False
    auth_required = agent_auth_required()
    for entry_id, fields in entries:
        if fields is None:  # trimmed away while pending
            client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
            continue
        try:
            message = protocol.decode_event(fields)
            authenticate(fields, message, auth_required)
            finished |= apply_event(message)
        except (protocol.ProtocolError, Rejected) as exc:
            dead_letter(client, protocol.EVENTS_STREAM, entry_id, fields, str(exc))
        client.xack(protocol.EVENTS_STREAM, GROUP, entry_id)
    if finished:
        nudge_scheduler()
    return len(entries)


def apply_event(message) -> bool:
    """Apply one parsed event; returns True when GPUs were freed (worth a scheduling cycle)."""
    if isinstance(message, protocol.NodeRegistered):
        register_node(message)
        if message.running_jobs:
            stop_strays(get_redis(), message.node, message.running_jobs)
            resend_duty_cycles(message.node, message.running_jobs)
        return False
    if isinstance(message, protocol.JobStarted):
        _job_started(message)
        return False
    if isinstance(message, protocol.JobExited):
        return _job_exited(message)
    raise Rejected(f"unhandled event kind {message.kind}")


def _allocated_on(job_id: int, node: str):
    return Allocation.objects.filter(job_id=job_id, gpu__node__name=node)


def _earlier_attempt(message, live_states=(JobState.PLACED, JobState.RUNNING)) -> bool:
    """Whether ``message`` comes from an earlier run of a job now placed or running again: an
    event re-sent after a Redis restart, say. (A job being stopped takes its run's events: its
    attempt count moved on when the stop began.)"""
    if message.launch_id is None:
        return False
    job = Job.objects.filter(pk=message.job_id, state__in=live_states).values("requeue_count", "preempt_count").first()
    return job is not None and message.launch_id != launch_id(message.job_id, job["requeue_count"] + job["preempt_count"])


def _when(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=dt_timezone.utc)


@transaction.atomic
def _job_started(message: protocol.JobStarted) -> None:
    allocations = _allocated_on(message.job_id, message.node)
    if not allocations.exists():
        raise Rejected(f"job {message.job_id} was never placed on node {message.node}")
    if _earlier_attempt(message, (JobState.PLACED,)):
        log.info("job %s: start of an earlier run (%s) ignored", message.job_id, message.launch_id)
        return
    if not allocations.filter(released_at__isnull=True).exists():
        # Started under an allocation that is gone (the job was requeued or ended): make it stop.
        transaction.on_commit(lambda: send_stop(message.node, message.job_id))
        return
    started_at = _when(message.started_at)
    if not Job.objects.filter(pk=message.job_id, state=JobState.PLACED).update(
        state=JobState.RUNNING, started_at=started_at
    ):
        Job.objects.filter(pk=message.job_id, state=JobState.CANCELLING, started_at__isnull=True).update(
            started_at=started_at
        )


@transaction.atomic
def _job_exited(message: protocol.JobExited) -> bool:
    allocations = _allocated_on(message.job_id, message.node)
    if not allocations.exists():
        raise Rejected(f"job {message.job_id} was never placed on node {message.node}")
    live = allocations.filter(released_at__isnull=True)
    if not live.exists():
        # A stale run (requeued since, or a duplicate report): the job's state is not its to set.
        return False
    if _earlier_attempt(message):
        log.info("job %s: exit of an earlier run (%s) ignored", message.job_id, message.launch_id)
        return False
    if message.absent and not Job.objects.filter(
        pk=message.job_id, state__in=(JobState.CANCELLING, JobState.PREEMPTING)
    ).exists():
        # The node never ran it (or no longer does) and was told to stop it, but the job is not
        # being stopped now: the stop was for an earlier attempt, not this one.
        return False
    now = timezone.now()
    outcome = {
        "exit_code": message.exit_code,
        "output_tail": message.output_tail,
        "error": message.error or ("Killed: out of GPU memory" if message.oom else ""),
        "finished_at": _when(message.finished_at),
        "peak_gpu_memory_mib": JobUsage.objects.filter(job_id=message.job_id)
        .values_list("peak_gpu_memory_mib", flat=True).first(),
    }
    Job.objects.filter(pk=message.job_id, state=JobState.CANCELLING).update(state=JobState.CANCELLED, **outcome)
    if message.requeue:
        # The node ended it (its agent restarted or shut down), not the job: run it again, once
        # every node of the job has stopped it (below).
        Job.objects.filter(pk=message.job_id, state__in=(JobState.PLACED, JobState.RUNNING)).update(
            state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
            pending_reason={"code": AGENT_RESTARTED, "details": {"node": message.node},
                            "message": f"Requeued: the agent on node {message.node} restarted or stopped while "
                                       "this job ran."},
        )
    succeeded = message.exit_code == 0 and message.error is None and not message.oom
    if Job.objects.filter(pk=message.job_id, state__in=(JobState.PLACED, JobState.RUNNING)).update(
        state=JobState.SUCCEEDED if succeeded else JobState.FAILED, **outcome
    ) and succeeded:
        record_profile(message.job_id)
    live.update(released_at=now)
    others = set(Allocation.objects.filter(job_id=message.job_id, released_at__isnull=True)
                 .values_list("gpu__node__name", flat=True))
    if not others:
        # Preempted or requeued, and now stopped everywhere: back to the queue (the stop it got
        # is not a failure of the job). Until then its GPUs elsewhere are still busy.
        Job.objects.filter(pk=message.job_id, state=JobState.PREEMPTING).update(
            state=JobState.PENDING, placed_at=None, started_at=None,
            peak_gpu_memory_mib=outcome["peak_gpu_memory_mib"],
        )
    # A gang's other nodes hold allocations of a job that is over (or going back to the queue):
    # stop them too. (Stops are idempotent; a preempted gang already had one.)
    for other in others:
        transaction.on_commit(lambda other=other: send_stop(other, message.job_id))
    return True
