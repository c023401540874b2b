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
from jobs.services.commands import send_stop
from monitoring.models import Node
from monitoring.services import alerts, health, live

log = logging.getLogger(__name__)

# One stop per stray (node, job) per this many seconds, however often it is reported.
STRAY_STOP_EVERY_S = 30
NODE_LOST = "node_lost"


def check_node_health(client: redis.Redis) -> dict:
    lost = [node.name for node in health.silent_nodes(client) if requeue_lost_node(node)]
    revived = health.revive_heartbeating(client)
    strays = 0
    for node, entry in live.latest_nodes(client).items():
        strays += stop_strays(client, node, entry.get("running_jobs", []))
    return {"lost": lost, "revived": revived, "strays_stopped": strays}


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
