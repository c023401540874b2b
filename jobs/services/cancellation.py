"""Cancelling many jobs at once for one user (``POST /api/v1/jobs/cancel/``, behind ``colony cancel
--array/--name/--mine``): which of the jobs asked for the user may cancel is decided here, with
one read whatever their number; the state changes are the lifecycle's, one transaction for all
(:func:`jobs.services.lifecycle.begin_cancel_many`). A single job's cancel is
:func:`jobs.services.submission.cancel_job`; who may cancel what is :mod:`jobs.services.roles`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster_ui import audit
from jobs.services import lifecycle, roles
from jobs.services.bulk_rows import ids_in

MAX_JOBS = 10_000  # per request: a sweep or two; the body limit allows about this many ids


@dataclass(frozen=True)
class Outcome:
    cancelled: tuple[int, ...]  # were pending: ended now
    stopping: tuple[int, ...]  # were running: their nodes were told to stop them
    skipped: dict[int, str]  # id -> why it was left as it was


def cancel_jobs(user, visible, job_ids) -> Outcome:
    """Cancel those of ``job_ids`` that ``user`` may cancel. ``visible``: the jobs ``user`` may
    see (``Job.objects.visible_to(user)``); any other id is skipped as "no such job", as a single
    cancel answers 404, so that nobody learns of other tenants' jobs this way."""
    wanted = list(dict.fromkeys(job_ids))
    rows = list(visible.filter(pk__in=ids_in(wanted)).select_related("owner", "tenant")
                .only("pk", "owner__username", "tenant__slug", "owner_id", "tenant_id"))
    leads = {tenant_id: roles.leads(user, tenant_id) for tenant_id in {job.tenant_id for job in rows}}
    allowed = [job.pk for job in rows if job.owner_id == user.pk or leads[job.tenant_id]]
    skipped = dict.fromkeys(wanted, "no such job")
    for job in rows:
        del skipped[job.pk]
        if job.pk not in allowed:
            skipped[job.pk] = roles.cancel_refused(job)
    done = lifecycle.begin_cancel_many(allowed) if allowed else lifecycle.CancelOutcome((), (), {})
    ended = {*done.cancelled, *done.stopping}
    audit.jobs_cancelled(user, [job for job in rows if job.pk in ended])  # (only others' jobs are written)
    for job_id, state in done.unchanged.items():
        skipped[job_id] = ("being cancelled already" if state == "CANCELLING"
                           else f"it has ended ({str(state).lower()})")
    return Outcome(done.cancelled, done.stopping, dict(sorted(skipped.items())))
