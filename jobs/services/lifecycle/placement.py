"""PENDING -> PLACED: a new attempt on the GPUs the scheduling cycle chose, its launches sent."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import F

from jobs.choices import JobEventKind, JobState
from jobs.models import Allocation, Job, JobEvent, JobWait
from jobs.scheduling.decisions import Place
from jobs.services import waits
from jobs.services.bulk_rows import ids_in, insert_rows
from jobs.services.commands import launch_commands, publish_many
from jobs.services.launches import LAUNCH_FIELDS, LAUNCH_RELATED, launch_envs, launch_spec, master_hosts

# Rows per multi-row INSERT / UPDATE of a placement batch.
PLACE_BATCH_ROWS = 2000


@transaction.atomic
def place_many(decisions: list[Place], now: datetime, run_class: dict[int, str]) -> int:
    """PENDING -> PLACED as a new attempt, for each decision whose job is still pending: its GPUs
    allocated, its timeline told where and why, a launch sent to each of its nodes after commit.
    ``run_class``: job id -> how it was admitted. Returns how many were placed.

    Set-based, because a first cycle places thousands of jobs: a fixed handful of statements (a
    locking read, one UPDATE per class, multi-row inserts of allocations and events) and one
    Redis pipeline, whatever the count. A job cancelled since the snapshot is skipped."""
    by_id = {decision.job_id: decision for decision in decisions}
    if not by_id:
        return 0
    # Locked, so nothing moves them between this read and the update (SQLite: the write lock).
    placed = set(Job.objects.select_for_update().filter(pk__in=ids_in(by_id), state=JobState.PENDING)
                 .values_list("pk", flat=True))
    if not placed:
        return 0
    by_class: dict[str, list[int]] = {}
    for job_id in placed:
        by_class.setdefault(run_class[job_id], []).append(job_id)
    for job_class, job_ids in by_class.items():
        Job.objects.filter(pk__in=ids_in(job_ids)).update(
            state=JobState.PLACED, placed_at=now, started_at=None, reserved_since=None,
            run_class=job_class, attempt=F("attempt") + 1,
        )
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids_in(placed)).select_related(*LAUNCH_RELATED)
            .only(*LAUNCH_FIELDS)}
    # How far off the first ETA each job was given turned out to be (+: started later).
    promised = dict(JobWait.objects.filter(job_id__in=ids_in(placed), first_eta_at__isnull=False)
                    .values_list("job_id", "first_eta_at"))
    first = [job for job in jobs.values() if job.attempt == 1 and job.pk in promised]
    for job in first:
        job.eta_error_s = now.timestamp() - promised[job.pk]
    Job.objects.bulk_update(first, ["eta_error_s"], batch_size=PLACE_BATCH_ROWS)
    waits.clear(placed)
    ordered = [(by_id[job_id], jobs[job_id]) for job_id in by_id if job_id in jobs]  # in the core's order
    insert_rows(Allocation, ("job_id", "gpu_id", "rank", "gpu_milli", "memory_limit_mib", "duty_cycle", "attempt",
                             "created_at"), [
        (job.pk, gpu_id, node_slice.node_rank, decision.gpu_milli, decision.memory_limit_mib, decision.duty_cycle,
         job.attempt, now)
        for decision, job in ordered for node_slice in decision.slices for gpu_id in node_slice.gpu_ids
    ])
    insert_rows(JobEvent, ("job_id", "attempt", "kind", "at", "node", "message"), [
        (job.pk, job.attempt, str(JobEventKind.PLACED), now, (decision.slices[0].node if decision.slices else "")[:63],
         (f"On {_gpus_text(decision)}, as {run_class[job.pk]}."
          + (f" {decision.note}" if getattr(decision, "note", "") else ""))[:500])
        for decision, job in ordered
    ])
    launches = []
    hosts = master_hosts([decision.rendezvous for decision, _ in ordered])
    for decision, job in ordered:
        envs = launch_envs(job.env, decision.slices, decision.rendezvous, hosts)
        launches.extend((node_slice.node, dict(
            job_id=job.pk, argv=job.command, gpu_indices=node_slice.gpu_indices, attempt=job.attempt,
            env=envs[node_slice.node], gpu_memory_limit_mib=decision.memory_limit_mib,
            duty_cycle=decision.duty_cycle, tenant=job.tenant.slug, max_runtime_s=job.max_runtime_s,
            **launch_spec(job, node_slice))) for node_slice in decision.slices)
    transaction.on_commit(lambda: publish_many(
        [(node, command) for node, launch in launches for command in launch_commands(node, **launch)]))
    return len(ordered)


def _gpus_text(decision: Place) -> str:
    return "; ".join(f"{s.node} GPU{'s' if len(s.gpu_indices) > 1 else ''} {','.join(map(str, s.gpu_indices))}"
                     for s in decision.slices)
