"""Carry out the core's decisions: one transaction, conditional updates, commands after commit.

Every state change is conditional on the state the core saw (``filter(pk, state).update``): a job
cancelled between snapshot and apply is simply skipped. Redis commands are published in
``on_commit``, so a rolled-back cycle sends nothing; a crash after commit but before publish
leaves a PLACED job whose launch is re-sent by ``resend_unstarted_launches``, and a stop lost the
same way is re-sent by ``resend_stops``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobClass, JobState
from jobs.models import Allocation, Job
from jobs.scheduling import Decisions
from jobs.scheduling.decisions import NodeSlice, Place, Rendezvous
from jobs.scheduling.topology import rendezvous_of
from jobs.services.commands import send_duty_cycle, send_launch, send_stop
from jobs.services.config import scheduler_config
from monitoring.models import Node


@dataclass(frozen=True)
class Applied:
    placed: int = 0
    preempted: int = 0
    throttled: int = 0


def apply_decisions(decisions: Decisions) -> Applied:
    now = timezone.now()
    with transaction.atomic():
        placed = sum(_place(place, now) for place in decisions.placements)
        preempted = sum(_preempt(preempt.job_id, preempt.message) for preempt in decisions.preemptions)
        throttled = sum(_throttle(t.job_id, t.duty_cycle) for t in decisions.throttles)
        _store_reservations(decisions)
        _store_pending_reasons(decisions, now.timestamp())
    return Applied(placed=placed, preempted=preempted, throttled=throttled)


def _place(place: Place, now: datetime) -> bool:
    job_class = JobClass.OPPORTUNISTIC if place.job_class == "opportunistic" else JobClass.GUARANTEED
    if not Job.objects.filter(pk=place.job_id, state=JobState.PENDING).update(
        state=JobState.PLACED, placed_at=now, pending_reason=None, reserved_since=None, run_class=job_class,
    ):
        return False
    Allocation.objects.bulk_create([
        Allocation(job_id=place.job_id, gpu_id=gpu_id, rank=node_slice.node_rank, gpu_milli=place.gpu_milli,
                   memory_limit_mib=place.memory_limit_mib, duty_cycle=place.duty_cycle)
        for node_slice in place.slices for gpu_id in node_slice.gpu_ids
    ])
    job = (Job.objects.select_related("tenant").only("command", "env", "requeue_count", "preempt_count", "tenant__slug")
           .get(pk=place.job_id))
    attempt = job.requeue_count + job.preempt_count
    envs = _launch_envs(job.env, place.slices, place.rendezvous)
    for node_slice in place.slices:
        transaction.on_commit(lambda s=node_slice: send_launch(
            s.node, place.job_id, job.command, s.gpu_indices, attempt=attempt, env=envs[s.node],
            gpu_memory_limit_mib=place.memory_limit_mib, duty_cycle=place.duty_cycle, tenant=job.tenant.slug,
        ))
    return True


def _launch_envs(job_env: dict, slices: tuple[NodeSlice, ...], rendezvous: Rendezvous | None) -> dict[str, dict]:
    """Per node: the job's own variables plus, for a gang, the torchrun rendezvous of that node."""
    if rendezvous is None:
        return {s.node: dict(job_env) for s in slices}
    hosts = dict(Node.objects.filter(name__in=[s.node for s in slices]).values_list("name", "hostname"))
    envs = {}
    for node_slice in slices:
        env = {**job_env, **rendezvous.env(node_slice, local_rank=0)}
        env["MASTER_ADDR"] = hosts.get(rendezvous.master_node) or rendezvous.master_node
        envs[node_slice.node] = env
    return envs


def _live_nodes(job_id: int) -> set[str]:
    return set(Allocation.objects.filter(job_id=job_id, released_at__isnull=True)
               .values_list("gpu__node__name", flat=True))


def _preempt(job_id: int, message: str) -> bool:
    """Stop an opportunistic job; it returns to the queue when its node confirms the exit."""
    if not Job.objects.filter(pk=job_id, state__in=(JobState.PLACED, JobState.RUNNING),
                              run_class=JobClass.OPPORTUNISTIC).update(
        state=JobState.PREEMPTING, preempt_count=F("preempt_count") + 1,
        pending_reason={"code": "preempted", "message": message, "details": {}},
    ):
        return False
    for node in _live_nodes(job_id):
        transaction.on_commit(lambda node=node: send_stop(node, job_id))
    return True


def _throttle(job_id: int, duty_cycle: float) -> bool:
    live = Allocation.objects.filter(job_id=job_id, released_at__isnull=True,
                                     job__state__in=(JobState.PLACED, JobState.RUNNING))
    was_suspended = live.filter(duty_cycle__lte=0).exists()
    if not live.exclude(duty_cycle=duty_cycle).update(duty_cycle=duty_cycle):
        return False
    for node in _live_nodes(job_id):
        transaction.on_commit(lambda node=node: send_duty_cycle(node, job_id, duty_cycle, resume=was_suspended))
    return True


def _store_reservations(decisions: Decisions) -> None:
    held = {r.job_id: r.since for r in decisions.reservations}
    Job.objects.filter(state=JobState.PENDING, reserved_since__isnull=False).exclude(pk__in=held).update(
        reserved_since=None
    )
    for job_id, since in held.items():
        Job.objects.filter(pk=job_id, state=JobState.PENDING, reserved_since__isnull=True).update(
            reserved_since=datetime.fromtimestamp(since, tz=dt_timezone.utc)
        )


# ETAs are stored as absolute times rounded to this, so that an estimate that does not move does
# not rewrite 50,000 rows every cycle.
ETA_ROUNDING_S = 30


def _reason(pending, now: float) -> dict:
    reason = pending.reason.as_dict()
    if pending.eta_s is not None:
        reason["eta_at"] = round((now + pending.eta_s) / ETA_ROUNDING_S) * ETA_ROUNDING_S
    return reason


def _store_pending_reasons(decisions: Decisions, now: float) -> None:
    """Write reasons that changed, one UPDATE per distinct reason.

    Thousands of pending jobs share a few dozen distinct reasons ("tenant at its ceiling", "waiting
    for 8 free GPUs"), so this is a handful of statements rather than a row-by-row bulk update.
    """
    reasons = {pending.job_id: _reason(pending, now) for pending in decisions.pending}
    if not reasons:
        return
    current = dict(Job.objects.filter(state=JobState.PENDING).values_list("id", "pending_reason"))
    changed: dict[str, list[int]] = defaultdict(list)
    texts: dict[str, dict] = {}
    for job_id, reason in reasons.items():
        if job_id in current and current[job_id] != reason:
            key = json.dumps(reason, sort_keys=True)
            texts[key] = reason
            changed[key].append(job_id)
    for key, job_ids in changed.items():
        for start in range(0, len(job_ids), 1000):
            Job.objects.filter(pk__in=job_ids[start:start + 1000], state=JobState.PENDING).update(
                pending_reason=texts[key]
            )


RESEND_AFTER_S = 15


def resend_unstarted_launches(redis_client) -> int:
    """Re-send the launch of jobs placed a while ago that never reported started.

    Covers a crash between commit and publish, and a command stream lost with Redis. The agent
    recognises a launch it already applied by its command id, so re-sending is harmless.
    """
    cutoff = timezone.now() - timezone.timedelta(seconds=RESEND_AFTER_S)
    resent = 0
    for job in Job.objects.filter(state=JobState.PLACED, placed_at__lt=cutoff).select_related("tenant"):
        if not redis_client.set(f"colony:resend:{job.pk}", 1, nx=True, ex=RESEND_AFTER_S):
            continue
        attempt = job.requeue_count + job.preempt_count
        slices, limits = _slices(job.pk)
        envs = _launch_envs(job.env, slices, rendezvous_of(job.pk, slices, scheduler_config()))
        for node_slice in slices:
            memory_limit, duty = limits[node_slice.node]
            send_launch(node_slice.node, job.pk, job.command, node_slice.gpu_indices, attempt=attempt,
                        env=envs[node_slice.node], gpu_memory_limit_mib=memory_limit, duty_cycle=duty,
                        tenant=job.tenant.slug)
        resent += 1
    return resent


def _slices(job_id: int) -> tuple[tuple[NodeSlice, ...], dict[str, tuple[int | None, float]]]:
    """The job's live placement as the core made it (node ranks, global ranks), and per node its
    memory limit and duty cycle."""
    by_node: dict[str, list[Allocation]] = defaultdict(list)
    for allocation in Allocation.objects.filter(job_id=job_id, released_at__isnull=True).select_related("gpu__node"):
        by_node[allocation.gpu.node.name].append(allocation)
    slices, first_rank = [], 0
    for node, held in sorted(by_node.items(), key=lambda item: (item[1][0].rank, item[0])):
        held.sort(key=lambda a: a.gpu.index)
        slices.append(NodeSlice(node=node, gpu_ids=tuple(a.gpu_id for a in held),
                                gpu_indices=tuple(a.gpu.index for a in held), node_rank=held[0].rank,
                                first_rank=first_rank))
        first_rank += len(held)
    return tuple(slices), {node: (held[0].memory_limit_mib, held[0].duty_cycle) for node, held in by_node.items()}


def resend_stops(redis_client) -> int:
    """Re-send the stop of jobs still cancelling or being preempted a while after it was sent.

    A stop lost with Redis (or published by a worker that died after commit) would otherwise
    leave the job holding its GPUs, and a guaranteed job waiting to reclaim them, for ever. The
    agent ignores a stop for a job it does not run, so a duplicate is harmless; a job whose node
    lost it is settled by node health (``requeue_vanished``).
    """
    now = timezone.now().timestamp()
    resent = 0
    stopping = Job.objects.filter(state__in=(JobState.CANCELLING, JobState.PREEMPTING)).values_list("pk", flat=True)
    for job_id in stopping:
        key = f"colony:stopping:{job_id}"
        first_seen = redis_client.get(key)
        if first_seen is None or now - float(first_seen) < RESEND_AFTER_S:
            if first_seen is None:
                redis_client.set(key, now, ex=STOPPING_MEMORY_S)
            continue
        for node in _live_nodes(job_id):
            send_stop(node, job_id)
        redis_client.set(key, now, ex=STOPPING_MEMORY_S)
        resent += 1
    return resent


# How long a stopping job's first sighting is remembered (far longer than any stop takes).
STOPPING_MEMORY_S = 24 * 3600
