"""First scheduling policy: whole GPUs, one node per job, jobs in priority then submit order.

Each job takes the best-fitting node (the fewest free GPUs that still fit it), so that big holes
stay free for big jobs. A job that does not fit is skipped, not waited on, so small jobs can run
past a large one; reservations against starvation come with the fair-share scheduler.
"""

from __future__ import annotations

from jobs.scheduling.decisions import Decisions, Pending, Place
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.scheduling.snapshot import ClusterSnapshot, GpuState, JobRequest, NodeState

MIB_PER_GIB = 1024


def decide(snapshot: ClusterSnapshot, now: float) -> Decisions:
    # Free GPUs per node, consumed as this cycle places jobs.
    free: dict[str, list[GpuState]] = {
        node.name: sorted(node.free_gpus(), key=lambda gpu: gpu.index)
        for node in snapshot.nodes
        if node.schedulable
    }
    nodes = {node.name: node for node in snapshot.nodes}
    placements: list[Place] = []
    pending: list[Pending] = []
    for job in sorted(snapshot.pending, key=lambda job: (-job.priority, job.submitted_at, job.id)):
        placement = _place(job, free)
        if placement is None:
            pending.append(Pending(job.id, _why_pending(job, nodes, free)))
            continue
        taken = set(placement.gpu_ids)
        free[placement.node] = [gpu for gpu in free[placement.node] if gpu.id not in taken]
        placements.append(placement)
    return Decisions(placements=tuple(placements), pending=tuple(pending))


def _fitting(job: JobRequest, gpus: list[GpuState]) -> list[GpuState]:
    need = job.gpu_memory_mib or 0
    return [gpu for gpu in gpus if gpu.memory_mib >= need]


def _place(job: JobRequest, free: dict[str, list[GpuState]]) -> Place | None:
    candidates = [
        (len(fitting), name, fitting)
        for name, gpus in free.items()
        if len(fitting := _fitting(job, gpus)) >= job.gpus
    ]
    if not candidates:
        return None
    _, name, fitting = min(candidates, key=lambda c: (c[0], c[1]))
    chosen = fitting[: job.gpus]
    return Place(
        job_id=job.id,
        node=name,
        gpu_ids=tuple(gpu.id for gpu in chosen),
        gpu_indices=tuple(gpu.index for gpu in chosen),
    )


def _why_pending(job: JobRequest, nodes: dict[str, NodeState], free: dict[str, list[GpuState]]) -> PendingReason:
    online = [node for node in nodes.values() if node.schedulable]
    if not online:
        return PendingReason(ReasonCode.NO_NODES_ONLINE, "No GPU node is online and accepting jobs.")
    need_mib = job.gpu_memory_mib or 0
    biggest_gpu = max((gpu.memory_mib for node in online for gpu in node.gpus), default=0)
    if need_mib > biggest_gpu:
        return PendingReason(
            ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY,
            f"Needs a GPU with {_gib(need_mib)} of memory; the largest online GPU has {_gib(biggest_gpu)}.",
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
    memory_note = f" with {_gib(need_mib)}" if need_mib else ""
    return PendingReason(
        ReasonCode.WAITING_FOR_FREE_GPUS,
        f"Waiting for {job.gpus} free GPU{'s' if job.gpus != 1 else ''}{memory_note} on one node; "
        f"the most free on any node is {most_free}.",
        {"needed_gpus": job.gpus, "most_free_on_a_node": most_free},
    )


def _gib(mib: int) -> str:
    return f"{mib / MIB_PER_GIB:.0f} GiB" if mib % MIB_PER_GIB == 0 else f"{mib / MIB_PER_GIB:.1f} GiB"
