"""Baseline policy: Tiresias-style discretised least-attained-service (Gu et al., NSDI'19).

A job's priority falls as it gathers service (GPUs x seconds run, earlier runs included): jobs
sit in queues split at ``THRESHOLDS_GPU_S``, lowest attained queue first, FIFO inside a queue.
A waiting job that does not fit may preempt running jobs of strictly lower queues (the most
served first); it starts in the next cycle, once they have stopped, on the GPUs promised to it.
Tiresias assumes jobs checkpoint, so preempted work resumes; the replay models that for every
policy. GPUs are exclusive and whole, placed as ``fifo_exclusive`` places them; quotas,
fractions and packing are ignored, as in the paper. Tiresias' starvation guard (promoting a job
that waited too long) is left out: the replays here are short enough not to need it.

``least_attained_guaranteed`` is the same policy bound by the promise Colony keeps: a job preempts
only its own tenant's work, or that of a tenant holding more GPUs than its guarantee, and never
takes such a tenant below it (``TenantQuota.guaranteed_gpus``). Within a tenant, LAS order rules.
It prices the guarantee: what LAS loses on a trace when it may not preempt what was promised.
"""

from __future__ import annotations

from bisect import bisect_right

from jobs.scheduling.decisions import Decisions, Pending, Place, Preempt, PreemptReason
from jobs.scheduling.policies.fifo_exclusive import ExclusiveGpus, place_exclusive
from jobs.scheduling import reasons
from jobs.scheduling.snapshot import ClusterSnapshot, GpuState, JobRequest, RunningJob

# Tiresias' two-queue setting; one GPU-hour is its order of magnitude for the Philly-like traces.
THRESHOLDS_GPU_S = (3600.0,)


def queue_of(attained_gpu_s: float) -> int:
    return bisect_right(THRESHOLDS_GPU_S, attained_gpu_s)


def least_attained_service(snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
    return _least_attained(snapshot, now, None)


def least_attained_guaranteed(snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
    return _least_attained(snapshot, now, _Guarantees(snapshot))


class _Guarantees:
    """Who may preempt whom while every tenant keeps its guarantee: a tenant's own jobs, or jobs of
    a tenant that holds more than its guaranteed GPUs once they and the victims already chosen
    this cycle have stopped."""

    def __init__(self, snapshot: ClusterSnapshot):
        self.guaranteed = {quota.name: quota.guaranteed_gpus for quota in snapshot.tenants}
        self.held: dict[str, int] = {}
        for job in snapshot.running:
            if not job.preempting:
                self.held[job.tenant] = self.held.get(job.tenant, 0) + len(job.gpu_ids)

    def allows(self, job: JobRequest, victim: RunningJob, picked: list[RunningJob]) -> bool:
        if victim.tenant == job.tenant:
            return True
        taken = sum(len(v.gpu_ids) for v in picked if v.tenant == victim.tenant)
        return self.held.get(victim.tenant, 0) - taken - len(victim.gpu_ids) >= self.guaranteed.get(victim.tenant, 0)

    def take(self, victims: list[RunningJob]) -> None:
        for victim in victims:
            self.held[victim.tenant] -= len(victim.gpu_ids)


def _least_attained(snapshot: ClusterSnapshot, now: float, guarantees: _Guarantees | None) -> Decisions:
    exclusive = ExclusiveGpus(snapshot)
    gpus = {gpu.id: (node.name, gpu) for node in snapshot.nodes for gpu in node.gpus}
    # Victims, least deserving first: highest queue, then the most served.
    served = {job.id: job.attained_gpu_s + max(0.0, now - job.started_at) * len(job.gpu_ids)
              for job in snapshot.running}
    victims = sorted((job for job in snapshot.running if not job.preempting),
                     key=lambda job: (-queue_of(served[job.id]), -served[job.id], -job.id))
    lowest_victim_queue = max((queue_of(served[v.id]) for v in victims), default=-1)
    chosen: set[int] = set()
    placements, pending, preemptions = [], [], []
    # The free GPUs and the victims left only shrink within a cycle: a job as wide as one that
    # found no victims (same queue, models, memory, spread) finds none either.
    hopeless: dict[tuple, int] = {}
    for job in sorted(snapshot.pending, key=lambda j: (queue_of(j.attained_gpu_s), -j.priority, j.submitted_at, j.id)):
        outcome = exclusive.place(job)
        if isinstance(outcome, Place):
            placements.append(outcome)
            continue
        key = (queue_of(job.attained_gpu_s), job.gpu_models, job.gpu_memory_mib, job.max_nodes)
        if queue_of(job.attained_gpu_s) >= lowest_victim_queue or job.gpus >= hopeless.get(key, job.gpus + 1):
            freed = []  # nobody runs in a lower queue, or a job this wide already found no victims
        else:
            freed = _preempt_for(job, victims, served, chosen, exclusive, gpus, guarantees)
        if not freed:
            hopeless[key] = min(job.gpus, hopeless.get(key, job.gpus))
            pending.append(Pending(job.id, outcome))
            continue
        preemptions.extend(Preempt(v.id, PreemptReason.RECLAIM_FOR_GUARANTEE,
                                   f"Job {job.id} has had less GPU time", for_job_id=job.id) for v in freed)
        pending.append(Pending(job.id, reasons.preempting_more_served(job.gpus, len(freed)), eta_at=now))
    return Decisions(placements=tuple(placements), pending=tuple(pending), preemptions=tuple(preemptions))


def _preempt_for(job, victims: list[RunningJob], served: dict[int, float], chosen: set[int],
                 exclusive: ExclusiveGpus, gpus: dict[int, tuple[str, GpuState]],
                 guarantees: _Guarantees | None = None) -> list[RunningJob]:
    """Victims of lower queues whose GPUs, added to the free ones, fit the job; [] if none do.

    The freed GPUs are promised: they leave the free ones for the rest of the cycle, and the job
    takes them (or others) next cycle."""
    rank = queue_of(job.attained_gpu_s)
    trial = {name: list(gs) for name, gs in exclusive.free.items()}
    picked: list[RunningJob] = []
    for victim in victims:
        if victim.id in chosen or queue_of(served[victim.id]) <= rank:
            continue
        if guarantees is not None and not guarantees.allows(job, victim, picked):
            continue
        picked.append(victim)
        for gpu_id in victim.gpu_ids:
            name, gpu = gpus[gpu_id]
            if name in trial:
                trial[name].append(gpu)
        for name in trial:
            trial[name].sort(key=lambda g: g.index)
        placement = place_exclusive(job, trial)
        if placement is not None:
            # Keep only the victims the placement needs, then promise their GPUs.
            needed = set(placement.gpu_ids)
            picked = [v for v in picked if needed & set(v.gpu_ids)]
            chosen.update(v.id for v in picked)
            if guarantees is not None:
                guarantees.take(picked)
            exclusive.remove(needed, tuple(name for name in placement.nodes if name in exclusive.free))
            return picked
    return []
