"""Carry out the core's decisions: one transaction, conditional updates, commands after commit."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.scheduling import Decisions
from jobs.services.commands import send_launch


def apply_decisions(decisions: Decisions) -> int:
    """Persist placements and pending reasons; returns how many jobs were placed.

    A job that is no longer pending (cancelled meanwhile) is skipped; a GPU that another writer
    took is refused by the database and that placement alone is dropped.
    """
    now = timezone.now()
    placed = 0
    with transaction.atomic():
        for place in decisions.placements:
            try:
                with transaction.atomic():
                    if not Job.objects.filter(pk=place.job_id, state=JobState.PENDING).update(
                        state=JobState.PLACED, placed_at=now, pending_reason=None
                    ):
                        continue
                    Allocation.objects.bulk_create([Allocation(job_id=place.job_id, gpu_id=g) for g in place.gpu_ids])
            except IntegrityError:
                continue
            placed += 1
            argv = Job.objects.values_list("command", flat=True).get(pk=place.job_id)
            transaction.on_commit(
                lambda place=place, argv=argv: send_launch(place.node, place.job_id, argv, place.gpu_indices)
            )
        _store_pending_reasons(decisions)
    return placed


def _store_pending_reasons(decisions: Decisions) -> None:
    reasons = {pending.job_id: pending.reason.as_dict() for pending in decisions.pending}
    if not reasons:
        return
    jobs = list(Job.objects.filter(pk__in=reasons, state=JobState.PENDING).only("id", "pending_reason"))
    changed = [job for job in jobs if job.pending_reason != reasons[job.id]]
    for job in changed:
        job.pending_reason = reasons[job.id]
    Job.objects.bulk_update(changed, ["pending_reason"], batch_size=500)
