"""The job's timeline: each change records one step, in the transaction that made it."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from jobs.choices import JobEventKind
from jobs.models import Job, JobEvent


def record(job_id: int, kind: str, message: str = "", *, node: str = "", attempt: int | None = None,
           at: datetime | None = None) -> JobEvent:
    """One step of the job's timeline, in the transaction of the change it records."""
    if attempt is None:
        attempt = Job.objects.filter(pk=job_id).values_list("attempt", flat=True).first() or 0
    return JobEvent.objects.create(job_id=job_id, attempt=attempt, kind=kind, at=at or timezone.now(), node=node[:63],
                                   message=message[:500])


def submitted(job: Job) -> JobEvent:
    """A new job's first step (its creation is the one state it is not moved into)."""
    return record(job.pk, JobEventKind.SUBMITTED, f"By {job.owner.get_username()} to {job.tenant.slug}.", attempt=0,
            at=job.submitted_at)


def submitted_many(jobs: list[Job], message: str) -> None:
    """The first step of each job of an array; ``message`` may name ``{index}``."""
    JobEvent.objects.bulk_create([JobEvent(job_id=job.pk, attempt=0, kind=JobEventKind.SUBMITTED, at=job.submitted_at,
                                           message=message.format(index=job.array_index)[:500]) for job in jobs])
