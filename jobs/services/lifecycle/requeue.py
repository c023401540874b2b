"""Losing a node: its jobs are settled at once, without waiting for exits that will never come."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobEventKind, JobState
from jobs.models import Allocation, Job, JobEvent
from jobs.scheduling.reasons import PendingReason
from jobs.services import waits
from jobs.services.commands import launch_id, send_stop
from jobs.services.lifecycle.endings import ended
from jobs.services.lifecycle.states import LIVE


@transaction.atomic
def requeue_now(job_ids, reason: PendingReason, *, only_running: bool = False) -> list[int]:
    """Its node is gone (lost, or no longer runs it): release the jobs' GPUs everywhere at once
    and settle each without waiting for an exit that will never come. Live jobs go back to the
    queue (requeue counted), cancelling ones end CANCELLED, preempted ones return to the queue.
    ``only_running``: requeue only jobs that are RUNNING (a placed job's launch may be in flight).
    Returns the ids requeued."""
    job_ids = list(job_ids)
    now = timezone.now()
    live_states = (JobState.RUNNING,) if only_running else LIVE
    requeued = list(Job.objects.filter(pk__in=job_ids, state__in=live_states).values_list("pk", flat=True))
    if only_running and not requeued:
        return []
    if only_running:
        job_ids = requeued
    stops = set(Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True)
                .values_list("job_id", "gpu__node__name", "job__attempt"))
    cancelled = list(Job.objects.filter(pk__in=job_ids, state=JobState.CANCELLING).values_list("pk", flat=True))
    stopped = list(Job.objects.filter(pk__in=job_ids, state=JobState.PREEMPTING).values_list("pk", flat=True))
    Job.objects.filter(pk__in=requeued).update(
        state=JobState.PENDING, placed_at=None, started_at=None, requeue_count=F("requeue_count") + 1,
    )
    waits.set_reason(requeued, reason.as_dict())
    Job.objects.filter(pk__in=cancelled, state=JobState.CANCELLING).update(state=JobState.CANCELLED, finished_at=now)
    Job.objects.filter(pk__in=stopped, state=JobState.PREEMPTING).update(
        state=JobState.PENDING, placed_at=None, started_at=None)
    attempts = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "attempt"))
    # Each REQUEUED step names the node: it marks the attempt as given up without its exit, so an
    # exit of it reported later is weighed, not dropped (``_exit_after_requeue``).
    node = reason.details.get("node", "")
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=j, attempt=attempts.get(j, 0), kind=JobEventKind.REQUEUED, at=now, node=node,
                  message=reason.message) for j in [*requeued, *stopped]]
        + [JobEvent(job_id=j, attempt=attempts.get(j, 0), kind=JobEventKind.FINISHED, at=now, node=node,
                    message="Cancelled; its node never confirmed the stop (" + reason.message + ")")
           for j in cancelled])
    Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True).update(released_at=now)
    for job_id in cancelled:
        ended(job_id, JobState.CANCELLED)
    # Wherever a process of theirs may still run (a gang's other nodes, a node that comes back).
    for job_id, node, attempt in stops:
        transaction.on_commit(lambda node=node, job_id=job_id, attempt=attempt:
                              send_stop(node, job_id, launch_id(job_id, attempt)))
    return requeued
