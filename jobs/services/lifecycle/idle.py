"""The idle-GPU policy's steps on a running job (:mod:`jobs.services.idle_reclaim` decides when):
warn its owner, make it opportunistic, suspend it, requeue it. Each is taken once per idle spell."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import F

from jobs.choices import JobEventKind, JobState, RunClass
from jobs.models import Job, JobEvent
from jobs.scheduling import reasons
from jobs.services import waits
from jobs.services.commands import send_duty_cycle
from jobs.services.lifecycle.endings import notify
from jobs.services.lifecycle.states import live_nodes
from jobs.services.lifecycle.stopping import stop_on
from jobs.services.lifecycle.timeline import record

# How each idle step's timeline entry begins: the reclaim service reads them back to take each
# step once per idle spell.
IDLE_STEP_WORDS = {"notify": "Warned: ", "opportunistic": "Made opportunistic: ", "suspend": "Suspended: "}


def _idle_running(job_id: int, attempt: int):
    """The job's row, locked, when it still runs ``attempt``; else None."""
    return Job.objects.select_for_update().filter(pk=job_id, state=JobState.RUNNING, attempt=attempt).first()


def _idle_step_taken(job_id: int, attempt: int, step: str, since: datetime) -> bool:
    return JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.IDLE, at__gte=since,
                                   message__startswith=IDLE_STEP_WORDS[step]).exists()


@transaction.atomic
def idle_warn(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy, first step: nothing changes but the owner is warned, once per idle spell
    (``since``: when it began; ``at``: when it was judged, the timeline's time)."""
    if _idle_running(job_id, attempt) is None or _idle_step_taken(job_id, attempt, "notify", since):
        return False
    record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["notify"] + figures, attempt=attempt, at=at)
    notify(job_id, "idle_warned")
    return True


@transaction.atomic
def mark_opportunistic(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy: a running guaranteed job becomes opportunistic (it keeps running and its GPUs;
    it may now be packed next to, throttled or preempted, and its tenant's guarantee frees)."""
    if _idle_running(job_id, attempt) is None:
        return False
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, attempt=attempt,
                              run_class=RunClass.GUARANTEED).update(run_class=RunClass.OPPORTUNISTIC):
        return False
    record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["opportunistic"] + figures
            + " It keeps running, but may now be preempted.", attempt=attempt, at=at)
    notify(job_id, "idle_demoted")
    return True


@transaction.atomic
def suspend_idle(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy: stop a running job's processes (SIGSTOP, by a SuspendJob to each of its nodes),
    once per idle spell. Its state and GPUs stay as they are: its GPU memory is still held. The
    scheduler's allocations keep their duty cycle, so no throttle decision resumes it; the idle
    policy's requeue (or a cancel) ends it."""
    if _idle_running(job_id, attempt) is None or _idle_step_taken(job_id, attempt, "suspend", since):
        return False
    record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["suspend"] + figures
            + " Its processes are stopped; its GPU memory stays held until it is requeued or cancelled.",
            attempt=attempt, at=at)
    for node in sorted(live_nodes(job_id)):  # (duty cycle 0 is the SuspendJob command)
        transaction.on_commit(lambda node=node: send_duty_cycle(node, job_id, 0.0))
    notify(job_id, "idle_suspended")
    return True


@transaction.atomic
def requeue_idle(job_id: int, attempt: int, figures: str, at: datetime, *, idle_minutes: int) -> bool:
    """Idle policy, last step: the running job is stopped (with its preemption notice) and goes
    back to the queue, its GPUs freed once its nodes confirm."""
    reason = reasons.idle_requeued(figures, idle_minutes)
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, attempt=attempt).update(
        state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
    ):
        return False
    waits.set_reason([job_id], reason.as_dict())
    record(job_id, JobEventKind.STOPPING, f"Requeued: {figures} Its nodes were told to stop it.", attempt=attempt,
            at=at)
    stop_on(job_id, live_nodes(job_id), notice=True)
    notify(job_id, "idle_requeued")
    return True
