"""Submitting, cancelling and requeueing jobs: the only places that create jobs or start a
cancel or an operator's requeue."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job, Tenant
from jobs.services.commands import send_stop
from jobs.services.nudge import nudge_scheduler


def tenants_of(user):
    """Tenants a user may submit to."""
    return Tenant.objects.filter(memberships__user=user)


def submit_job(*, owner, tenant: Tenant, name: str, command: list[str], gpus: int, **spec) -> Job:
    """Create a pending job; ``spec`` holds the optional Job fields (gpu_milli, gpu_memory_mib,
    gpu_models, priority, opportunistic_only, shareable, max_nodes, max_runtime_s, profile_key)."""
    job = Job.objects.create(owner=owner, tenant=tenant, name=name, command=command, gpus=gpus, **spec)
    transaction.on_commit(nudge_scheduler)
    return job


class NotCancellable(Exception):
    pass


@transaction.atomic
def cancel_job(job: Job) -> Job:
    """Pending jobs end at once; placed or running ones are stopped on their node first."""
    now = timezone.now()
    if Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(
        state=JobState.CANCELLED, finished_at=now, pending_reason=None
    ):
        job.refresh_from_db()
        return job
    if not Job.objects.filter(pk=job.pk, state__in=(JobState.PLACED, JobState.RUNNING, JobState.PREEMPTING)).update(
        state=JobState.CANCELLING
    ):
        job.refresh_from_db()
        raise NotCancellable(f"job {job.pk} is {job.state.lower()} and cannot be cancelled")
    nodes = set(
        Allocation.objects.filter(job=job, released_at__isnull=True).values_list("gpu__node__name", flat=True)
    )
    for node in nodes:
        transaction.on_commit(lambda node=node: send_stop(node, job.pk))
    job.refresh_from_db()
    return job


class NotRequeueable(Exception):
    pass


@transaction.atomic
def requeue_job(job: Job, by: str) -> Job:
    """An operator sends a placed or running job back to the queue: its processes are stopped
    (as for a preemption) and it waits for its next placement with its place in the queue kept."""
    if not Job.objects.filter(pk=job.pk, state__in=(JobState.PLACED, JobState.RUNNING)).update(
        state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
        pending_reason={"code": "requeued_by_operator", "details": {"by": by},
                        "message": f"Requeued by operator {by}; waiting to be placed again."},
    ):
        job.refresh_from_db()
        raise NotRequeueable(f"job {job.pk} is {job.state.lower()}; only placed or running jobs can be requeued")
    nodes = set(Allocation.objects.filter(job=job, released_at__isnull=True).values_list("gpu__node__name", flat=True))
    for node in nodes:
        transaction.on_commit(lambda node=node: send_stop(node, job.pk))
    job.refresh_from_db()
    return job
