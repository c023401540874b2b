"""What follows a job's end, in the transaction that ended it: its wait reason cleared, jobs that
ran ``after_ok`` it cancelled down the chain (unless it succeeded), owners told if they opted in."""

from __future__ import annotations

from django.db.models import Case, CharField, Value, When
from django.utils import timezone

from jobs.choices import JobEventKind, JobState
from jobs.models import Job, JobDependency, JobEvent
from jobs.services import notifications, waits
from jobs.services.bulk_rows import ids_in


def ended(job_id: int, state: str, *, tell_as: str | None = None) -> None:
    """What follows a job's end, in the transaction that ended it (see :func:`ended_many`)."""
    ended_many([job_id], state, tell_as=tell_as)


def ended_many(job_ids: list[int], state: str, *, tell_as: str | None = None) -> None:
    """What follows these jobs' end (each ``state``), in the transaction that ended them: jobs
    that ran ``after_ok`` one of them can never start unless it succeeded, so they end too (and
    theirs, down the chain); owners hear of it if they asked to (``tell_as``: the event they hear,
    when not the state itself)."""
    if not job_ids:
        return
    waits.clear(job_ids)
    notify_many(job_ids, tell_as or state.lower())
    if state != JobState.SUCCEEDED:
        _cancel_after_ok_chain(job_ids, state)


def _cancel_after_ok_chain(ended: list[int], state: str) -> None:
    """Cancel every pending job that ran ``after_ok`` one of ``ended`` (which ended ``state``),
    and theirs, down the chain. A chain is cut a level at a time with a fixed handful of
    statements per level (a locking read, one UPDATE, one multi-row INSERT), never one per job:
    a sweep of a thousand dependants is cancelled in the request that ended its root. Each
    dependant's error and timeline name the job it ran after."""
    causes = dict.fromkeys(ended, state.lower())  # job id -> how it ended
    now = timezone.now()
    while causes:
        doomed: dict[int, tuple[int, int]] = {}  # dependant -> (its attempt, the job it ran after)
        for dependant, attempt, on in (
                Job.objects.select_for_update(of=("self",))
                .filter(state=JobState.PENDING, dependencies__kind=JobDependency.Kind.OK,
                        dependencies__on_id__in=ids_in(causes))
                .order_by("pk").values_list("pk", "attempt", "dependencies__on_id")):
            doomed.setdefault(dependant, (attempt, on))  # (one that waits on several: the first)
        if not doomed:
            return
        words = {job_id: f"Cancelled: job {on}, which it ran after (after_ok), ended {causes[on]}."
                 for job_id, (_, on) in doomed.items()}
        by_words: dict[str, list[int]] = {}
        for job_id, text in words.items():
            by_words.setdefault(text, []).append(job_id)
        # Locked above, so every one of them is still pending: one UPDATE, its error per cause.
        Job.objects.filter(pk__in=ids_in(doomed), state=JobState.PENDING).update(
            state=JobState.CANCELLED, finished_at=now,
            error=Case(*[When(pk__in=ids_in(ids), then=Value(text)) for text, ids in by_words.items()],
                       default=Value(""), output_field=CharField()))
        JobEvent.objects.bulk_create(
            [JobEvent(job_id=job_id, attempt=attempt, kind=JobEventKind.FINISHED, at=now, message=words[job_id][:500])
             for job_id, (attempt, _) in doomed.items()], batch_size=1000)
        waits.clear(doomed)
        # Nobody cancelled them: to their owners this is a failure, and opted-in failures are told.
        notify_many(list(doomed), "failed")
        causes = dict.fromkeys(doomed, JobState.CANCELLED.lower())


def notify(job_id: int, event: str) -> None:
    notifications.job_event(job_id, event)


def notify_many(job_ids: list[int], event: str) -> None:
    """:func:`notify` for each job whose owner opted in to ``event``: found in one query, so a
    chain of a thousand jobs whose owner asked for nothing costs one query, not a thousand."""
    if len(job_ids) == 1:
        notify(job_ids[0], event)
        return
    opt_in = notifications.OPT_IN.get(event)
    if opt_in is None:  # (cancelled: the user asked for it; nobody is told)
        return
    owners = (Job.objects.filter(pk__in=ids_in(job_ids), owner__notification_settings__isnull=False)
              .values_list("pk", "owner__notification_settings__events"))
    for job_id, events in owners:
        if opt_in in (events or []):
            notify(job_id, event)
