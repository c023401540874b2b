"""What happens to jobs when nodes disappear and come back.

A node whose heartbeat expires is marked LOST and its jobs are requeued exactly once (the
UP -> LOST transition and each job's state change are conditional updates). When the node talks
again, any process it still runs for a job that no longer belongs there is stopped, so nothing
runs twice.
"""

from __future__ import annotations

import logging

import redis
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.commands import send_duty_cycle, send_stop
from monitoring.models import Node
from monitoring.services import alerts, health, live

log = logging.getLogger(__name__)

# One stop per stray (node, job) per this many seconds, however often it is reported.
STRAY_STOP_EVERY_S = 30
NODE_LOST = "node_lost"
VANISHED = "vanished_from_node"
MISSING_KEY = "colony:missing"
# A running job its node has stopped reporting for this long is presumed gone (the agent was
# restarted without it). Long, so that an exit event still in the queue is never overtaken.
VANISHED_AFTER_S = 60.0


def check_node_health(client: redis.Redis) -> dict:
    lost = [node.name for node in health.silent_nodes(client) if requeue_lost_node(node)]
    revived = health.revive_heartbeating(client)
    strays = vanished = 0
    for node, entry in live.latest_nodes(client).items():
        strays += stop_strays(client, node, entry.get("running_jobs", []))
        vanished += requeue_vanished(client, node, entry.get("running_jobs", []), entry["ts"])
    return {"lost": lost, "revived": revived, "strays_stopped": strays, "vanished": vanished}


@transaction.atomic
def requeue_lost_node(node: Node) -> bool:
    if not health.mark_lost(node):
        return False
    now = timezone.now()
    allocations = Allocation.objects.filter(gpu__node=node, released_at__isnull=True)
    job_ids = set(allocations.values_list("job_id", flat=True))
    # A gang spanning nodes loses every member: release its allocations everywhere.
    other_nodes = set(
        Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True)
        .exclude(gpu__node=node).values_list("job_id", "gpu__node__name")
    )
    Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True).update(released_at=now)
    reason = {
        "code": NODE_LOST,
        "message": f"Requeued: node {node.name} stopped responding while this job ran on it.",
        "details": {"node": node.name},
    }
    requeued = Job.objects.filter(pk__in=job_ids, state__in=(JobState.PLACED, JobState.RUNNING))
    requeued_ids = list(requeued.values_list("pk", flat=True))
    Job.objects.filter(pk__in=requeued_ids).update(
        state=JobState.PENDING, pending_reason=reason, placed_at=None, started_at=None,
        requeue_count=F("requeue_count") + 1,
    )
    Job.objects.filter(pk__in=job_ids, state=JobState.CANCELLING).update(state=JobState.CANCELLED, finished_at=now)
    # Being preempted or requeued when its node went: its allocations are gone, so no exit will
    # ever move it on. It goes back to the queue now.
    Job.objects.filter(pk__in=job_ids, state=JobState.PREEMPTING).update(
        state=JobState.PENDING, placed_at=None, started_at=None)
    for job_id, other in other_nodes:
        transaction.on_commit(lambda other=other, job_id=job_id: send_stop(other, job_id))
    alerts.node_lost(node)
    log.warning("node %s lost; requeued jobs %s", node.name, requeued_ids)
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


def requeue_vanished(client: redis.Redis, node: str, running_jobs: list[int], sample_ts: float) -> int:
    """Requeue RUNNING jobs a live node has not reported for ``VANISHED_AFTER_S``.

    An agent restarted after a crash no longer knows jobs it had started: without this they
    would stay RUNNING forever. The node is sent a stop in case a process survived untracked.
    """
    reported = set(running_jobs)
    ours = Allocation.objects.filter(gpu__node__name=node, released_at__isnull=True, job__state=JobState.RUNNING,
                                     job__started_at__lt=timezone.now() - timezone.timedelta(seconds=5))
    requeued = 0
    for job_id in set(ours.values_list("job_id", flat=True)):
        field = f"{node}:{job_id}"
        if job_id in reported:
            client.hdel(MISSING_KEY, field)
            continue
        client.hsetnx(MISSING_KEY, field, sample_ts)
        first_missed = float(client.hget(MISSING_KEY, field))
        if sample_ts - first_missed < VANISHED_AFTER_S:
            continue
        client.hdel(MISSING_KEY, field)
        if _requeue_vanished_job(job_id, node):
            requeued += 1
    return requeued


@transaction.atomic
def _requeue_vanished_job(job_id: int, node: str) -> bool:
    now = timezone.now()
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING).update(
        state=JobState.PENDING, placed_at=None, started_at=None, requeue_count=F("requeue_count") + 1,
        pending_reason={"code": VANISHED, "details": {"node": node},
                        "message": f"Requeued: node {node} stopped reporting this job (its agent restarted?)."},
    ):
        return False
    for other in set(Allocation.objects.filter(job_id=job_id, released_at__isnull=True)
                     .values_list("gpu__node__name", flat=True)):
        transaction.on_commit(lambda other=other: send_stop(other, job_id))
    Allocation.objects.filter(job_id=job_id, released_at__isnull=True).update(released_at=now)
    log.warning("job %s vanished from node %s; requeued", job_id, node)
    return True
