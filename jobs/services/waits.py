"""Writing a waiting job's verdict (``JobWait``) outside the scheduling loop: the lifecycle says
why a job went back to the queue the moment it does, and drops the verdict when the job leaves
it. The loop's own set-based writer is ``apply._store_pending_reasons``."""

from __future__ import annotations

from collections.abc import Iterable

from jobs.models import Job, JobWait
from jobs.services.bulk_rows import ids_in


def set_reason(job_ids: Iterable[int], reason: dict) -> None:
    """These jobs wait for ``reason`` now (no ETA yet: the next cycle gives one). What each was
    first promised is kept."""
    rows = [JobWait(job_id=job_id, reason=reason, eta_at=None) for job_id in job_ids]
    if rows:
        JobWait.objects.bulk_create(rows, update_conflicts=True, unique_fields=["job"],
                                    update_fields=["reason", "eta_at"])


def clear(job_ids: Iterable[int]) -> None:
    """These jobs no longer wait (placed, cancelled, ended)."""
    job_ids = list(job_ids)
    if job_ids:
        JobWait.objects.filter(job_id__in=ids_in(job_ids)).delete()


def none_yet(jobs: Iterable[Job]) -> None:
    """Jobs just created have no verdict until the next cycle: say so on the instances, so that
    answering with them (``pending_reason``) reads nothing back."""
    related = Job.wait.related
    for job in jobs:
        related.set_cached_value(job, None)
