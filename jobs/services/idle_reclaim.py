"""Idle-GPU reclaim: a tenant's policy (like Run:ai's idle-GPU timeout) applied to its running jobs.

A job is *idle* while every GPU it holds stays under the tenant's utilisation threshold (its
``idle_util_percent``, else ``COLONY_IDLE_GPU_UTIL_PERCENT``) in the 10 s GPU rollups ingest
already writes; its *idle spell* starts after the last bucket in which any of its GPUs was busy
(or when it started). Missing data never counts as idle: the spell must be covered by rollups
(:data:`MIN_COVERAGE`, as the idle-GPU alert asks). A GPU shared with a busy job is busy.

The steps, each optional (a tenant with none set is never looked at), in this order:

- ``notify``: the owner is warned (timeline + notification), nothing else changes;
- ``opportunistic``: a guaranteed job becomes opportunistic: it keeps running, but may now be
  packed next to and throttled, its tenant's guarantee is free for the tenant's other jobs, and
  it is among the first the scheduler reclaims from whenever its tenant holds more than its
  guarantee (the core takes only from borrowers, youngest first). It stays opportunistic for the
  rest of this attempt, even once busy again;
- ``suspend``: its processes are stopped (SIGSTOP by its agent, as throttling does). Its GPU
  memory stays allocated: the GPUs are not free, but their compute is, for packed work. A stopped
  process cannot show it is busy again, so a suspended job stays suspended until the ``requeue``
  step (which the policy then requires) or its owner cancels it;
- ``requeue``: it is stopped (with its preemption notice) and put back in the queue, but only
  while another pending job waits for GPUs it could use (:func:`someone_waits_for`): with nobody
  waiting, a requeue only throws its work away. The requeued job then stays off the nodes it
  idled on for ``COLONY_IDLE_REQUEUE_AVOID_S`` (15 min, :mod:`jobs.services.avoided_nodes`), so the
  waiting job gets those GPUs instead of the idle one going straight back onto them.

Each step is taken once per idle spell, recorded in the job's timeline with the figures, and
told to its owner if they opted in to "idle". A job that becomes busy again starts a new spell.
Every state change goes through :mod:`jobs.services.lifecycle`; this module only decides when.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from jobs.choices import JobEventKind, JobState, RunClass
from jobs.idle_policy import NOTIFY, OPPORTUNISTIC, ORDER, REQUEUE, SUSPEND, Step, policy_problems, steps_of
from jobs.models import Allocation, Job, JobEvent, Tenant
from jobs.services import avoided_nodes, lifecycle
from monitoring.choices import Resolution
from monitoring.models import GpuRollup
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

# Pending jobs that wait for something other than GPUs: requeuing an idle job frees nothing for them.
NOT_WAITING_FOR_GPUS = ("waiting_for_dependency", "array_limit", "user_limit", "at_max_gpus", "over_max_gpus",
                        "invalid_request")

# Rollups must cover this share of an idle spell (ingest lag, the bucket being written now).
MIN_COVERAGE = 0.8
BUCKET = timedelta(seconds=Resolution.TEN_SECONDS)
LOOKBACK_MARGIN = timedelta(minutes=10)

POLICY_FILTER = Q(idle_notify_minutes__isnull=False) | Q(idle_opportunistic_minutes__isnull=False) | Q(
    idle_suspend_minutes__isnull=False) | Q(idle_requeue_minutes__isnull=False)


@dataclass(frozen=True)
class Idle:
    """Where a running job stands in its idle spell (None for a busy job: no spell)."""

    since: datetime
    minutes: float
    done: tuple[str, ...]  # steps taken in this spell
    upcoming: tuple[tuple[Step, datetime], ...]  # steps still to come, with when

    @property
    def next_step(self) -> Step | None:
        return self.upcoming[0][0] if self.upcoming else None

    @property
    def next_at(self) -> datetime | None:
        return self.upcoming[0][1] if self.upcoming else None

    @property
    def suspended(self) -> bool:
        return SUSPEND in self.done

    def as_dict(self) -> dict:
        return {"since": self.since, "minutes": round(self.minutes, 1), "done": list(self.done),
                "next_step": self.next_step.name if self.next_step else None, "next_at": self.next_at,
                "upcoming": [{"step": step.name, "minutes": step.minutes, "at": at} for step, at in self.upcoming]}


# ---------------------------------------------------------------- the policy (its steps: jobs/idle_policy.py)


def threshold_of(tenant: Tenant) -> float:
    return settings.COLONY_IDLE_GPU_UTIL_PERCENT if tenant.idle_util_percent is None else tenant.idle_util_percent


# ---------------------------------------------------------------- how long a job has been idle


def _held_gpus(job: Job) -> list[int]:
    return list(Allocation.objects.filter(job_id=job.pk, attempt=job.attempt, released_at__isnull=True)
                .values_list("gpu_id", flat=True))


def idle_since(job: Job, gpu_ids: list[int], threshold: float, lookback: timedelta, now: datetime) -> datetime | None:
    """When the job's current idle spell began, or None when it is not idle (busy now, or too
    little data to tell). Looks back at most ``lookback`` (see :func:`_lookback`)."""
    if not gpu_ids or job.started_at is None:
        return None
    start = max(job.started_at, now - lookback)
    rows = GpuRollup.objects.filter(gpu_id__in=gpu_ids, resolution=Resolution.TEN_SECONDS, bucket_start__gte=start,
                                    bucket_start__lt=now)
    last_busy = rows.aggregate(at=Max("bucket_start", filter=Q(util_max__gte=threshold)))["at"]
    since = start if last_busy is None else last_busy + BUCKET
    if now - since < BUCKET:
        return None
    # Every GPU must have reported through the spell: silence is not idleness.
    needed = (now - since) / BUCKET * MIN_COVERAGE
    counts = dict(rows.filter(bucket_start__gte=since, util_max__isnull=False).values_list("gpu_id")
                  .annotate(n=Count("id")).values_list("gpu_id", "n"))
    if any(counts.get(gpu_id, 0) < needed for gpu_id in gpu_ids):
        return None
    return since


def _lookback(steps: list[Step]) -> timedelta:
    """How far back a spell is measured: past the last step, so the figures it reports are true
    for a beat or a few late; a longer spell reads as this long, which is all any step needs."""
    return timedelta(minutes=steps[-1].minutes) + LOOKBACK_MARGIN


def _done(job: Job, since: datetime) -> tuple[str, ...]:
    messages = JobEvent.objects.filter(job_id=job.pk, attempt=job.attempt, kind=JobEventKind.IDLE,
                                       at__gte=since).values_list("message", flat=True)
    return tuple(step for step in ORDER if any(m.startswith(lifecycle.IDLE_STEP_WORDS.get(step, "\0"))
                                               for m in messages))


def idle_state(job: Job, now: datetime | None = None) -> Idle | None:
    """The job's idle spell under its tenant's policy, for the page and the API; None when the
    job is not running, its tenant has no policy, or it is not idle."""
    if job.state != JobState.RUNNING:
        return None
    steps = steps_of(job.tenant)
    if not steps:
        return None
    now = now or timezone.now()
    since = idle_since(job, _held_gpus(job), threshold_of(job.tenant), _lookback(steps), now)
    if since is None:
        return None
    done = _done(job, since)
    upcoming = tuple((step, since + timedelta(minutes=step.minutes)) for step in steps
                     if step.name not in done and not _moot(job, step))
    return Idle(since=since, minutes=(now - since).total_seconds() / 60, done=done, upcoming=upcoming)


def _moot(job: Job, step: Step) -> bool:
    """A step with nothing to do for this job: it was admitted opportunistic already."""
    return step.name == OPPORTUNISTIC and job.run_class != RunClass.GUARANTEED


def describe(idle: Idle) -> str:
    """The job page's sentence: "Idle for 22 min; at 30 min it becomes opportunistic, ..."."""
    text = f"Idle for {int(idle.minutes)} min"
    if idle.suspended:
        text += " and suspended (its processes are stopped; its GPU memory stays held)"
    if idle.upcoming:
        # A step already due is taken by the next beat (within COLONY_IDLE_RECLAIM_INTERVAL_S).
        text += "; " + ", ".join(f"at {step.minutes} min {step.will}"
                                 + (" (due now)" if step.minutes <= idle.minutes else "") for step, _ in idle.upcoming)
    return text + "."


# ---------------------------------------------------------------- applying it (the beat task)


def reclaim(now: datetime | None = None) -> dict[str, int]:
    """Take every step that is due for the running jobs of tenants with a policy. Idempotent:
    each step is taken once per idle spell (the lifecycle checks, under the job's row lock).
    Returns how many of each step were taken."""
    now = now or timezone.now()
    taken = dict.fromkeys(ORDER, 0)
    for tenant in Tenant.objects.filter(POLICY_FILTER):
        problems = policy_problems(tenant)
        if problems:
            log.warning("idle policy of tenant %s not applied: %s", tenant.slug, "; ".join(problems.values()))
            continue
        steps = steps_of(tenant)
        first = timedelta(minutes=steps[0].minutes)
        lookback = _lookback(steps)
        threshold = threshold_of(tenant)
        for job in Job.objects.filter(tenant=tenant, state=JobState.RUNNING, started_at__lte=now - first):
            job.tenant = tenant
            gpu_ids = _held_gpus(job)
            since = idle_since(job, gpu_ids, threshold, lookback, now)
            if since is None:
                continue
            idle_for = now - since
            for step in steps:
                if idle_for < timedelta(minutes=step.minutes) or _moot(job, step):
                    continue
                if _take(job, step, since, now, threshold, len(gpu_ids)):
                    taken[step.name] += 1
                if step.name == REQUEUE:
                    break
    return taken


def _take(job: Job, step: Step, since: datetime, now: datetime, threshold: float, gpus: int) -> bool:
    minutes = int((now - since).total_seconds() // 60)
    figures = (f"idle {minutes} min (all {gpus} GPU{'s' * (gpus != 1)} under {threshold:g}% utilisation since "
               f"{timezone.localtime(since):%H:%M}); the tenant's {step.name} step is at {step.minutes} min.")
    if step.name == NOTIFY:
        return lifecycle.idle_warn(job.pk, job.attempt, since, figures, now)
    if step.name == OPPORTUNISTIC:
        return lifecycle.mark_opportunistic(job.pk, job.attempt, since, figures, now)
    if step.name == SUSPEND:
        return lifecycle.suspend_idle(job.pk, job.attempt, since, figures, now)
    if not someone_waits_for(job, gpus):
        return False  # nobody would get the GPUs: requeuing only loses the job's work (checked each beat)
    nodes = set(Allocation.objects.filter(job_id=job.pk, attempt=job.attempt, released_at__isnull=True)
                .values_list("gpu__node__name", flat=True))
    if not lifecycle.requeue_idle(job.pk, job.attempt, figures, now, idle_minutes=minutes):
        return False
    # Off those nodes for a while, so the job waiting for the GPUs gets them: without it the idle
    # job, often first in the queue, went straight back onto its GPU 0.4 s later, its work lost.
    hold_s = settings.COLONY_IDLE_REQUEUE_AVOID_S
    client = get_redis()
    for node in nodes:
        transaction.on_commit(lambda node=node: avoided_nodes.avoid(client, job.pk, node, hold_s))
    return True


def someone_waits_for(job: Job, gpus: int) -> bool:
    """Whether another pending job could use what requeuing ``job`` frees: one waiting for GPUs
    (not for a dependency or a limit of its own) that asks for no more than ``gpus`` of them."""
    return (Job.objects.filter(state=JobState.PENDING, gpus__lte=max(gpus, 1)).exclude(pk=job.pk)
            .exclude(wait__reason__code__in=NOT_WAITING_FOR_GPUS).exists())
