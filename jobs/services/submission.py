"""Submitting, cancelling and requeueing jobs: the only places that create jobs or start a
cancel or an operator's requeue."""

from __future__ import annotations

from django.db import transaction

from jobs.models import Job, Tenant
from jobs.services import lifecycle
from jobs.services.nudge import nudge_scheduler


def tenants_of(user):
    """Tenants a user may submit to."""
    return Tenant.objects.filter(memberships__user=user)


def submit_job(*, owner, tenant: Tenant, name: str, command: list[str], gpus: int, **spec) -> Job:
    """Create a pending job; ``spec`` holds the optional Job fields (gpu_milli, gpu_memory_mib,
    gpu_models, priority, opportunistic_only, shareable, max_nodes, max_runtime_s, profile_key)."""
    job = Job.objects.create(owner=owner, tenant=tenant, name=name, command=command, gpus=gpus, **spec)
    lifecycle.submitted(job)
    transaction.on_commit(nudge_scheduler)
    return job


NotCancellable = lifecycle.NotAllowed
NotRequeueable = lifecycle.NotAllowed


def cancel_job(job: Job) -> Job:
    """Pending jobs end at once; placed or running ones are stopped on their node first."""
    try:
        lifecycle.begin_cancel(job.pk)
    finally:
        job.refresh_from_db()
    return job


def requeue_job(job: Job, by: str) -> Job:
    """An operator sends a placed or running job back to the queue: its processes are stopped
    (as for a preemption) and it waits for its next placement with its place in the queue kept."""
    try:
        lifecycle.begin_requeue(job.pk, by)
    finally:
        job.refresh_from_db()
    return job
