"""Baseline policy: exclusive whole GPUs, one node per job, priority then submit order, no quotas.

The walking skeleton's scheduler, kept as the baseline that benchmarks and the trace replay compare
against. Each job takes the best-fitting node (the fewest free GPUs that still fit it), so that big
holes stay free for big jobs. A job that does not fit is skipped, not waited on. A GPU with any
running job (or marked busy) is not free; fractions, profiles and tenants are ignored.
"""

from __future__ import annotations

from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place
from jobs.scheduling.reasons import PendingReason, ReasonCode, gib
from jobs.scheduling.snapshot import ClusterSnapshot, GpuState, JobRequest, NodeState


def fifo_exclusive(snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
    held = {gpu_id for job in snapshot.running for gpu_id in job.gpu_ids}
    # Free GPUs per node, consumed as this cycle places jobs.
    free: dict[str, list[GpuState]] = {
        node.name: sorted((g for g in node.free_gpus() if g.id not in held), key=lambda gpu: gpu.index)
        for node in snapshot.nodes
        if node.schedulable
    }
    nodes = {node.name: node for node in snapshot.nodes}
    placements: list[Place] = []
    pending: list[Pending] = []
    # Free GPUs only shrink within a cycle, so a request that found no node finds none later:
    # remember the reason per request shape instead of searching every node again.
    failed: dict[tuple, PendingReason] = {}
    for job in sorted(snapshot.pending, key=lambda job: (-job.priority, job.submitted_at, job.id)):
        shape = (job.gpus, job.gpu_memory_mib, job.gpu_models)
        if shape in failed:
            pending.append(Pending(job.id, failed[shape]))
            continue
        placement = _place(job, free)
        if placement is None:
            failed[shape] = _why_pending(job, nodes, free)
            pending.append(Pending(job.id, failed[shape]))
            continue
        taken = set(placement.gpu_ids)
        free[placement.node] = [gpu for gpu in free[placement.node] if gpu.id not in taken]
        placements.append(placement)
    return Decisions(placements=tuple(placements), pending=tuple(pending))


def _fitting(job: JobRequest, gpus: list[GpuState]) -> list[GpuState]:
    need = job.gpu_memory_mib or 0
    return [gpu for gpu in gpus if gpu.memory_mib >= need and (not job.gpu_models or gpu.model in job.gpu_models)]


def _place(job: JobRequest, free: dict[str, list[GpuState]]) -> Place | None:
    if job.gpus < 1:
        return None
    best: tuple[int, str, list[GpuState]] | None = None
    for name, gpus in free.items():
        if len(gpus) < job.gpus:
            continue  # cheap pre-check before filtering by memory and model
        fitting = _fitting(job, gpus)
        if len(fitting) >= job.gpus and (best is None or (len(fitting), name) < best[:2]):
            best = (len(fitting), name, fitting)
    if best is None:
        return None
    _, name, fitting = best
    chosen = fitting[: job.gpus]
    return Place(job_id=job.id, slices=(NodeSlice(node=name, gpu_ids=tuple(gpu.id for gpu in chosen),
                                                  gpu_indices=tuple(gpu.index for gpu in chosen)),))


def _why_pending(job: JobRequest, nodes: dict[str, NodeState], free: dict[str, list[GpuState]]) -> PendingReason:
    online = [node for node in nodes.values() if node.schedulable]
    if not online:
        return PendingReason(ReasonCode.NO_NODES_ONLINE, "No GPU node is online and accepting jobs.")
    need_mib = job.gpu_memory_mib or 0
    biggest_gpu = max((gpu.memory_mib for node in online for gpu in node.gpus), default=0)
    if need_mib > biggest_gpu:
        return PendingReason(
            ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY,
            f"Needs a GPU with {gib(need_mib)} of memory; the largest online GPU has {gib(biggest_gpu)}.",
            {"needed_mib": need_mib, "largest_mib": biggest_gpu},
        )
    widest = max(len(_fitting(job, list(node.gpus))) for node in online)
    if job.gpus > widest:
        return PendingReason(
            ReasonCode.GANG_LARGER_THAN_ANY_NODE,
            f"Needs {job.gpus} GPUs on one node; the largest online node has {widest} that fit.",
            {"needed_gpus": job.gpus, "largest_node_gpus": widest},
        )
    most_free = max((len(_fitting(job, gpus)) for gpus in free.values()), default=0)
    memory_note = f" with {gib(need_mib)}" if need_mib else ""
    return PendingReason(
        ReasonCode.WAITING_FOR_FREE_GPUS,
        f"Waiting for {job.gpus} free GPU{'s' if job.gpus != 1 else ''}{memory_note} on one node; "
        f"the most free on any node is {most_free}.",
        {"needed_gpus": job.gpus, "most_free_on_a_node": most_free},
    )
