"""Stopping a placed or running job: a user's cancel, a preemption, an operator's requeue, the
runtime-limit backstop. Each moves the job to its stopping state and tells its nodes; what the
nodes then report settles it (:mod:`jobs.services.lifecycle.node_reports`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobEventKind, JobState, RunClass
from jobs.models import Allocation, Job, JobEvent
from jobs.scheduling import reasons
from jobs.services import waits
from jobs.services.bulk_rows import ids_in
from jobs.services.commands import launch_id, send_stop
from jobs.services.lifecycle.endings import ended, ended_many, notify
from jobs.services.lifecycle.states import LIVE, current_launch_id, live_nodes
from jobs.services.lifecycle.timeline import record

log = logging.getLogger(__name__)


class NotAllowed(Exception):
    """The job is not in a state the requested change applies to; the message says why."""


def stop_on(job_id: int, nodes, *, notice: bool = False) -> None:
    """Tell ``nodes`` to stop the job's current attempt (and only that one). ``notice``: it goes
    back to the queue, so it gets its preemption notice (its ``preempt_grace_s``, within the
    operator's ceiling) and the deadline in its ``COLONY_PREEMPT_FILE``."""
    current = current_launch_id(job_id)
    grace = None
    if notice:
        asked = Job.objects.filter(pk=job_id).values_list("preempt_grace_s", flat=True).first()
        grace = min(float(settings.COLONY_STOP_GRACE_SECONDS if asked is None else asked),
                    float(settings.COLONY_MAX_PREEMPT_GRACE_S))
    for node in nodes:
        transaction.on_commit(lambda node=node: send_stop(node, job_id, current, preempt_grace_s=grace))


@dataclass(frozen=True)
class CancelOutcome:
    """What :func:`begin_cancel_many` did to each job it was given."""

    cancelled: tuple[int, ...]  # were pending: ended at once
    stopping: tuple[int, ...]  # were placed, running or preempted: their nodes were told to stop them
    unchanged: dict[int, str]  # could not be cancelled (ended already, being cancelled): id -> state


@transaction.atomic
def begin_cancel(job_id: int) -> str:
    """A user's cancel: a pending job ends at once, a placed or running one is stopped first.
    Returns the new state; raises :class:`NotAllowed` for a job that already ended."""
    outcome = begin_cancel_many([job_id])
    if outcome.cancelled:
        return JobState.CANCELLED
    if outcome.stopping:
        return JobState.CANCELLING
    raise NotAllowed(f"job {job_id} is {str(outcome.unchanged.get(job_id)).lower()} and cannot be cancelled")


@transaction.atomic
def begin_cancel_many(job_ids) -> CancelOutcome:
    """Users' cancel of these jobs (whoever may cancel them is the caller's business): pending
    ones end at once, placed, running or preempted ones are stopped first, in one transaction of
    a fixed handful of statements however many jobs (and dependants, :func:`_cancel_after_ok_chain`)."""
    job_ids = list(dict.fromkeys(job_ids))
    now = timezone.now()
    rows = list(Job.objects.select_for_update().filter(pk__in=ids_in(job_ids)).order_by("pk")
                .values_list("pk", "state", "attempt"))
    pending = {pk: attempt for pk, state, attempt in rows if state == JobState.PENDING}
    stopping = {pk: attempt for pk, state, attempt in rows if state in (*LIVE, JobState.PREEMPTING)}
    unchanged = {pk: state for pk, state, _ in rows if pk not in pending and pk not in stopping}
    if pending:
        Job.objects.filter(pk__in=ids_in(pending), state=JobState.PENDING).update(
            state=JobState.CANCELLED, finished_at=now)
    if stopping:
        Job.objects.filter(pk__in=ids_in(stopping), state__in=(*LIVE, JobState.PREEMPTING)).update(
            state=JobState.CANCELLING)
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=pk, attempt=attempt, kind=JobEventKind.FINISHED, at=now,
                  message="Cancelled while waiting in the queue.") for pk, attempt in pending.items()]
        + [JobEvent(job_id=pk, attempt=attempt, kind=JobEventKind.STOPPING, at=now,
                    message="Cancel requested; its nodes were told to stop it.")
           for pk, attempt in stopping.items()],
        batch_size=1000)
    ended_many(list(pending), JobState.CANCELLED)
    if stopping:
        for job_id, node in set(Allocation.objects.filter(job_id__in=ids_in(stopping), released_at__isnull=True)
                                .values_list("job_id", "gpu__node__name")):
            current = launch_id(job_id, stopping[job_id])
            transaction.on_commit(lambda node=node, job_id=job_id, current=current: send_stop(node, job_id, current))
    return CancelOutcome(tuple(pending), tuple(stopping), unchanged)


@transaction.atomic
def begin_preempt(job_id: int, message: str) -> bool:
    """Stop an opportunistic job to make room; it returns to the queue once every node stopped it."""
    if not Job.objects.filter(pk=job_id, state__in=LIVE, run_class=RunClass.OPPORTUNISTIC).update(
        state=JobState.PREEMPTING, preempt_count=F("preempt_count") + 1,
    ):
        return False
    waits.set_reason([job_id], reasons.preempted(message).as_dict())
    record(job_id, JobEventKind.STOPPING, f"Preempted: {message}")
    stop_on(job_id, live_nodes(job_id), notice=True)
    notify(job_id, "preempted")
    return True


@transaction.atomic
def begin_requeue(job_id: int, by: str) -> None:
    """An operator sends a placed or running job back to the queue (its place in it kept)."""
    if not Job.objects.filter(pk=job_id, state__in=LIVE).update(
        state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
    ):
        state = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
        raise NotAllowed(f"job {job_id} is {str(state).lower()}; only placed or running jobs can be requeued")
    waits.set_reason([job_id], reasons.requeued_by_operator(by).as_dict())
    record(job_id, JobEventKind.STOPPING, f"Requeued by operator {by}; its nodes were told to stop it.")
    stop_on(job_id, live_nodes(job_id), notice=True)


@transaction.atomic
def time_out(job_id: int, started_before: datetime) -> bool:
    """The control plane's backstop for a runtime limit its node did not enforce (an old agent,
    a lost launch field): the job ends TIMEOUT now and its nodes are told to stop it; its GPUs
    stay held until they confirm. Fenced on the run it judged (``started_at``)."""
    limit = Job.objects.filter(pk=job_id).values_list("max_runtime_s", flat=True).first()
    error = f"Stopped by the control plane: ran longer than its runtime limit of {limit} s"
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, started_at__lt=started_before).update(
        state=JobState.TIMEOUT, finished_at=timezone.now(), error=error,
    ):
        return False
    record(job_id, JobEventKind.FINISHED, error + "; its nodes were told to stop it.")
    stop_on(job_id, live_nodes(job_id))
    ended(job_id, JobState.TIMEOUT)
    log.warning("job %s ran past its runtime limit of %s s; stopping it", job_id, limit)
    return True
