"""What happens to jobs when nodes disappear and come back.

A node whose heartbeat has stayed expired for a grace (``COLONY_NODE_LOST_GRACE_S``; until then it
is only suspected, :mod:`monitoring.services.health`) is marked LOST and its jobs are requeued
exactly once (the UP -> LOST transition and each job's state change are conditional updates, made by
:mod:`jobs.services.lifecycle`). A running job far past its runtime limit is timed out here too,
a backstop for a node that did not enforce it. When the node talks
again, any process it still runs for a job that no longer belongs there is stopped, so nothing
runs twice.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone as dt_timezone

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.bulk_rows import ids_in
from jobs.scheduling import reasons
from jobs.services import lifecycle
from jobs.services.commands import launch_id, send_duty_cycle, send_query, send_stop
from monitoring.models import Node
from monitoring.services import alerts, health, live

log = logging.getLogger(__name__)

# One stop per stray (node, job) per this many seconds, however often it is reported.
STRAY_STOP_EVERY_S = 30
MISSING_KEY = "colony:missing"
# A running job its node has stopped reporting for this long is presumed gone (the agent was
# restarted without it) even if the node never answers for it. Long, so that an exit event still
# in the queue is never overtaken; nodes that report attempts are asked and settle far sooner.
VANISHED_AFTER_S = 60.0
# How long after a job's start its node's samples must list it, and how often it is asked.
RECONCILE_AFTER_START_S = 2.0
RECONCILE_EVERY_S = 10
# A placed job not running on its node this long after placement is asked about: one that ran
# and ended there before both its reports were lost answers with its exit; a node that never got
# the launch answers "absent", which changes nothing (the launch is re-sent after 15 s).
RECONCILE_PLACED_AFTER_S = 5


def check_node_health(client: redis.Redis) -> dict:
    lost = [node.name for node in health.silent_nodes(client) if requeue_lost_node(node)]
    revived = health.revive_heartbeating(client)
    strays = vanished = 0
    samples = live.latest_nodes(client)
    for node, entry in samples.items():
        strays += stop_strays(client, node, entry.get("running_jobs", []))
        strays += stop_earlier_attempts(client, node, entry.get("running_launches") or [])
        vanished += requeue_vanished(client, node, entry)
    duties = reconcile_duty_cycles(client, samples)
    timed_out = time_out_overdue()
    return {"lost": lost, "revived": revived, "strays_stopped": strays, "vanished": vanished, "timed_out": timed_out,
            "duty_cycles_resent": duties}


@transaction.atomic
def requeue_lost_node(node: Node) -> bool:
    if not health.mark_lost(node):
        return False
    job_ids = set(Allocation.objects.filter(gpu__node=node, released_at__isnull=True).values_list("job_id", flat=True))
    # A gang spanning nodes loses every member: requeue_now releases its allocations everywhere.
    requeued = lifecycle.requeue_now(job_ids, reasons.node_lost(node.name))
    alerts.node_lost(node)
    log.warning("node %s lost; requeued jobs %s", node.name, requeued)
    return True


def stop_strays(client: redis.Redis, node: str, running_jobs: list[int]) -> int:
    """Stop processes a node runs for jobs that hold no live allocation on it."""
    if not running_jobs:
        return 0
    rightful = set(
        Allocation.objects.filter(job_id__in=running_jobs, gpu__node__name=node, released_at__isnull=True)
        .values_list("job_id", flat=True)
    )
    stopped = 0
    for job_id in set(running_jobs) - rightful:
        if client.set(f"colony:stray:{node}:{job_id}", 1, nx=True, ex=STRAY_STOP_EVERY_S):
            log.warning("node %s runs job %s which does not belong there; stopping it", node, job_id)
            send_stop(node, job_id)
            stopped += 1
    return stopped


def stop_earlier_attempts(client: redis.Redis, node: str, running_launches: list[str]) -> int:
    """Stop runs of an earlier attempt of a job still going on ``node`` (their stop was lost, say
    with a partition) while the job has moved on to a later attempt: such a run would also keep
    the node from starting the job's current attempt there. Each stop names the run it is for."""
    attempts: dict[int, int] = {}
    for launch in running_launches:
        parsed = _parse_launch_id(launch)
        if parsed is not None:
            attempts[parsed[0]] = parsed[1]
    if not attempts:
        return 0
    stopped = 0
    for job_id, current in Job.objects.filter(pk__in=attempts).values_list("pk", "attempt"):
        earlier = launch_id(job_id, attempts[job_id])
        if attempts[job_id] < current and client.set(f"colony:stray:{node}:{earlier}", 1, nx=True,
                                                       ex=STRAY_STOP_EVERY_S):
            log.warning("node %s still runs %s of job %s, now at attempt %s; stopping that run", node, earlier,
                        job_id, current)
            send_stop(node, job_id, earlier)
            stopped += 1
    return stopped


def _parse_launch_id(text: str) -> tuple[int, int] | None:
    parts = text.split("-")
    if len(parts) != 3 or parts[0] != "launch" or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])


def resend_duty_cycles(node: str, running_jobs: list[int]) -> int:
    """Tell a node that registered again (after a Redis restart, say) the duty cycle each of its
    running jobs should have: a throttle or un-throttle command lost on the way is not lost for
    good. Commands are idempotent, so repeating one that did arrive costs nothing."""
    desired = dict(
        Allocation.objects.filter(job_id__in=running_jobs, gpu__node__name=node, released_at__isnull=True,
                                  job__state=JobState.RUNNING)
        .values_list("job_id", "duty_cycle").distinct()
    )
    for job_id, duty_cycle in desired.items():
        send_duty_cycle(node, job_id, duty_cycle, resume=True)
    return len(desired)


# A node that runs a job at a higher duty cycle than the stored one is sent the stored one again
# once its samples have said so, about the same stored value, for this long without a gap (a
# throttle the loop has just sent may not have reached the node when it sampled: AIMD moves a
# thousand jobs a cycle), and at most this often a job.
DUTY_DISAGREE_S = 5.0
DUTY_GAP_S = 4.0  # (two checks of the node-health beat)
DUTY_RESEND_EVERY_S = 30
DUTY_MEMORY_S = 120


def reconcile_duty_cycles(client: redis.Redis, samples: dict[str, dict]) -> int:
    """Send again the stored duty cycle of each job that its node (its latest sample, in
    ``samples``) runs faster than that. A throttle or a suspension lost on the way (Redis failing
    over, a pipeline that failed) was re-sent only when the node registered again, and the loop
    sends nothing while the stored value does not move: a job left suspended ran on, full speed,
    beside the guaranteed job it had been suspended for. Only that direction is mended, and never
    by a resume: a job the node runs slower than stored harms no one, and may be meant to (the idle
    policy suspends a job without storing it); a re-send that crosses a newer throttle can then
    only have lowered the job. One query for every node. Returns how many were sent."""
    reported: dict[tuple[int, str], float] = {}
    sampled_at: dict[str, float] = {}
    for node, entry in samples.items():
        running, duties, at = entry.get("running_jobs") or [], entry.get("duty_cycles") or [], entry.get("ts")
        if running and len(duties) == len(running) and isinstance(at, (int, float)):  # (else an agent that does not say)
            # (a job at 0 runs no faster than anything stored)
            reported.update(((job_id, node), duty) for job_id, duty in zip(running, duties) if duty)
            sampled_at[node] = at
    if not reported:
        return 0
    stored = set(Allocation.objects.filter(job_id__in=ids_in({job_id for job_id, _ in reported}),
                                           released_at__isnull=True, job__state=JobState.RUNNING,
                                           duty_cycle__lt=1.0)  # (at 1, nothing runs faster: most jobs)
                 .values_list("job_id", "gpu__node__name", "duty_cycle").distinct())
    faster = sorted((job_id, node, want) for job_id, node, want in stored
                    if isinstance(have := reported.get((job_id, node)), (int, float)) and have > want + 1e-6)
    if not faster:
        return 0
    keys = [f"colony:duty-disagree:{node}:{job_id}" for job_id, node, _ in faster]
    resend, pipe = [], client.pipeline(transaction=False)
    for key, (job_id, node, want), before in zip(keys, faster, client.mget(keys)):
        at, seen = sampled_at[node], _disagreement(before)
        if seen is None or seen[0] != want or at - seen[2] > DUTY_GAP_S:  # (first seen, about another value, or anew)
            pipe.set(key, f"{want!r} {at!r} {at!r}", ex=DUTY_MEMORY_S)
        elif at - seen[1] >= DUTY_DISAGREE_S:
            resend.append((job_id, node, want))
            pipe.delete(key)
        else:
            pipe.set(key, f"{want!r} {seen[1]!r} {at!r}", ex=DUTY_MEMORY_S)
    pipe.execute()
    sent = 0
    for job_id, node, want in resend:
        if client.set(f"colony:duty-resent:{node}:{job_id}", 1, nx=True, ex=DUTY_RESEND_EVERY_S):
            log.warning("job %d runs at duty cycle %s on %s, not %s: sending it again", job_id,
                        reported[job_id, node], node, want)
            send_duty_cycle(node, job_id, want)  # (0: a SuspendJob; never a resume)
            sent += 1
    return sent


def _disagreement(value: bytes | None) -> tuple[float, float, float] | None:
    """(stored duty cycle, first and last sample times it was seen exceeded) from its key."""
    try:
        want, first, last = (value or b"").split()
        return float(want), float(first), float(last)
    except ValueError:
        return None


def requeue_vanished(client: redis.Redis, node: str, entry: dict) -> int:
    """Reconcile what ``node`` says it runs (its latest sample, ``entry``) with what the control
    plane believes, kubelet-style.

    A RUNNING job whose current attempt the node's sample does not list (taken well after the job
    started, so the start cannot be in flight) has ended there or is unknown there. The node is
    asked about that attempt (:class:`agents.protocol.QueryAttempt`, which changes nothing there,
    at most every ``RECONCILE_EVERY_S``; a stale sample only costs a question): it answers
    with the attempt's exit if it ran and ended there (recovering an exit lost with a trimmed
    stream or a Redis restart), or that it does not know it, which requeues the job at once
    (:func:`jobs.services.lifecycle.finish`). Either way the job is settled within seconds. A
    node that does not report attempts (an older agent), or never answers, has the job requeued
    after ``VANISHED_AFTER_S``.
    """
    sample_ts = entry["ts"]
    reported = set(entry.get("running_jobs", []))
    launches = entry.get("running_launches")
    if launches is not None:
        _reconcile_placed(client, node, set(launches), sample_ts)
    started_before = datetime.fromtimestamp(sample_ts - RECONCILE_AFTER_START_S, tz=dt_timezone.utc)
    ours = set(Allocation.objects.filter(gpu__node__name=node, released_at__isnull=True,
                                         job__state=JobState.RUNNING, job__started_at__lt=started_before)
               .values_list("job_id", "job__attempt"))
    requeued = 0
    for job_id, attempt in ours:
        field = f"{node}:{job_id}"
        missing_key = f"{MISSING_KEY}:{field}"
        current = launch_id(job_id, attempt)
        if (current in launches) if launches is not None else (job_id in reported):
            client.delete(missing_key)
            continue
        # When this node first failed to list it; expires on its own once the job has settled.
        client.set(missing_key, sample_ts, nx=True, ex=int(VANISHED_AFTER_S * 3))
        first_missed = float(client.get(missing_key) or sample_ts)
        if launches is not None and client.set(f"colony:reconcile:{field}", 1, nx=True, ex=RECONCILE_EVERY_S):
            log.info("node %s does not list job %s's running attempt %s; asking it", node, job_id, current)
            send_query(node, job_id, current)
        if sample_ts - first_missed < VANISHED_AFTER_S:
            continue
        client.delete(missing_key)
        if _requeue_vanished_job(job_id, node):
            requeued += 1
    return requeued


def _reconcile_placed(client: redis.Redis, node: str, launches: set[str], sample_ts: float) -> None:
    """PLACED jobs whose start report was lost: one the node runs is started now; one placed a
    while ago that it does not run is asked about (it may have run and ended there, both its
    reports lost; a launch that never arrived is re-sent by the scheduling loop meanwhile)."""
    # Judged by the sample's own time: a sample taken before (or just after) the placement says
    # nothing about whether the launch arrived.
    placed_before = datetime.fromtimestamp(sample_ts - RECONCILE_PLACED_AFTER_S, tz=dt_timezone.utc)
    for job_id, attempt, placed_at in set(
        Allocation.objects.filter(gpu__node__name=node, released_at__isnull=True, job__state=JobState.PLACED)
        .values_list("job_id", "job__attempt", "job__placed_at")
    ):
        current = launch_id(job_id, attempt)
        if current in launches:
            if lifecycle.start(job_id, node, current, datetime.fromtimestamp(sample_ts, tz=dt_timezone.utc)):
                log.warning("job %s runs on node %s but its start report was lost; now RUNNING", job_id, node)
        elif placed_at and placed_at < placed_before and client.set(
                f"colony:reconcile:{node}:{job_id}", 1, nx=True, ex=RECONCILE_EVERY_S):
            send_query(node, job_id, current)


def _requeue_vanished_job(job_id: int, node: str) -> bool:
    requeued = lifecycle.requeue_now([job_id], reasons.vanished_from_node(node, asked=False), only_running=True)
    if requeued:
        log.warning("job %s vanished from node %s; requeued", job_id, node)
    return bool(requeued)


# The control plane's backstop stops a job this long past its runtime limit and stop grace: its
# node enforces the limit itself and reports the exit first, unless it could not.
TIMEOUT_BACKSTOP_SLACK_S = 30.0


def time_out_overdue(now=None) -> list[int]:
    """End RUNNING jobs that ran well past their ``max_runtime_s`` (TIMEOUT), telling their
    nodes to stop them. Running jobs with a limit are few (bounded by the GPUs), so this reads
    them rather than doing date arithmetic in SQL that SQLite and PostgreSQL spell differently."""
    now = now or timezone.now()
    slack = settings.COLONY_STOP_GRACE_SECONDS + TIMEOUT_BACKSTOP_SLACK_S
    overdue = []
    for job_id, started_at, limit in Job.objects.filter(
        state=JobState.RUNNING, max_runtime_s__isnull=False, started_at__isnull=False
    ).values_list("pk", "started_at", "max_runtime_s"):
        deadline = started_at + timezone.timedelta(seconds=limit + slack)
        if deadline < now and lifecycle.time_out(job_id, started_before=now - timezone.timedelta(seconds=limit + slack)):
            overdue.append(job_id)
    return overdue
