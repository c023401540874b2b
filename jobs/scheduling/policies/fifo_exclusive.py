"""Baseline policy: exclusive whole GPUs, priority then submit order, no quotas.

The walking skeleton's scheduler, kept as the baseline that benchmarks and the trace replay compare
against (the "FIFO with exclusive GPUs" of the papers). Each job takes the best-fitting node (the
fewest free GPUs that still fit it), so that big holes stay free for big jobs; a gang wider than
any free node takes whole free nodes, most free first, unless ``max_nodes`` is 1. A job that does
not fit is skipped, not waited on. A GPU with any running job (or marked busy) is not free;
fractions, profiles and tenants are ignored.
"""

from __future__ import annotations

from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place
from jobs.scheduling import reasons
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.scheduling.snapshot import ClusterSnapshot, GpuState, JobRequest, NodeState


def fifo_exclusive(snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
    gpus = ExclusiveGpus(snapshot)
    placements: list[Place] = []
    pending: list[Pending] = []
    for job in sorted(snapshot.pending, key=lambda job: (-job.priority, job.submitted_at, job.id)):
        outcome = gpus.place(job)
        if isinstance(outcome, Place):
            placements.append(outcome)
        else:
            pending.append(Pending(job.id, outcome))
    return Decisions(placements=tuple(placements), pending=tuple(pending))


class ExclusiveGpus:
    """The free whole GPUs of one cycle, consumed as jobs are placed (shared with the
    least-attained-service baseline).

    Free GPUs only shrink within a cycle, so a request that found no node finds none later, nor
    does one of the same width asking for more memory: the smallest failing memory per (width,
    models, spread) is remembered instead of searching every node again.
    """

    def __init__(self, snapshot: ClusterSnapshot):
        held = {gpu_id for job in snapshot.running for gpu_id in job.gpu_ids}
        self.free: dict[str, list[GpuState]] = {
            node.name: sorted((g for g in node.free_gpus() if g.id not in held), key=lambda gpu: gpu.index)
            for node in snapshot.nodes
            if node.schedulable
        }
        self.nodes = {node.name: node for node in snapshot.nodes}
        self._failed: dict[tuple, tuple[int, PendingReason]] = {}

    def place(self, job: JobRequest) -> Place | PendingReason:
        """Take GPUs for the job, or say why there are none."""
        shape, need = (job.gpus, job.gpu_models, job.max_nodes), job.gpu_memory_mib or 0
        memo = self._failed.get(shape)
        if memo is not None and need >= memo[0]:
            smallest, reason = memo
            if need != smallest and reason.code is ReasonCode.WAITING_FOR_FREE_GPUS:
                reason = reasons.waiting_for_free_gpus(job.gpus, need, job.max_nodes == 1,
                                                       reason.details["most_free_on_a_node"])
            elif need != smallest:
                reason = why_pending_exclusive(job, self.nodes, self.free)
            return reason
        placement = place_exclusive(job, self.free)
        if placement is None:
            reason = why_pending_exclusive(job, self.nodes, self.free)
            self._failed[shape] = (need, reason)
            return reason
        self.remove(set(placement.gpu_ids), placement.nodes)
        return placement

    def remove(self, gpu_ids: set[int], nodes: tuple[str, ...]) -> None:
        for name in nodes:
            self.free[name] = [gpu for gpu in self.free[name] if gpu.id not in gpu_ids]


def _fitting(job: JobRequest, gpus: list[GpuState]) -> list[GpuState]:
    need = job.gpu_memory_mib or 0
    return [gpu for gpu in gpus if gpu.memory_mib >= need and (not job.gpu_models or gpu.model in job.gpu_models)]


def place_exclusive(job: JobRequest, free: dict[str, list[GpuState]]) -> Place | None:
    if job.gpus < 1:
        return None
    best: tuple[int, str, list[GpuState]] | None = None
    for name, gpus in free.items():
        if len(gpus) < job.gpus:
            continue  # cheap pre-check before filtering by memory and model
        fitting = _fitting(job, gpus)
        if len(fitting) >= job.gpus and (best is None or (len(fitting), name) < best[:2]):
            best = (len(fitting), name, fitting)
    if best is not None:
        _, name, fitting = best
        chosen = fitting[: job.gpus]
        return Place(job_id=job.id, slices=(NodeSlice(node=name, gpu_ids=tuple(gpu.id for gpu in chosen),
                                                      gpu_indices=tuple(gpu.index for gpu in chosen)),))
    if job.max_nodes == 1:
        return None
    # Fewest nodes: the most free first. Ranks follow that order, as in the production core.
    widest = sorted(((len(fitting), name, fitting) for name, fitting in
                     ((name, _fitting(job, gpus)) for name, gpus in free.items()) if fitting),
                    key=lambda entry: (-entry[0], entry[1]))
    slices, covered = [], 0
    for count, name, fitting in widest[: job.max_nodes or None]:
        chosen = fitting[: job.gpus - covered]
        slices.append(NodeSlice(node=name, gpu_ids=tuple(g.id for g in chosen),
                                gpu_indices=tuple(g.index for g in chosen),
                                node_rank=len(slices), first_rank=covered))
        covered += len(chosen)
        if covered == job.gpus:
            return Place(job_id=job.id, slices=tuple(slices))
    return None


def why_pending_exclusive(job: JobRequest, nodes: dict[str, NodeState],
                          free: dict[str, list[GpuState]]) -> PendingReason:
    """In the core's words (``reasons``); a gang here may mix GPU models, and its reasons say so."""
    online = [node for node in nodes.values() if node.schedulable]
    if not online:
        return reasons.no_nodes_online(len(nodes), sum(1 for node in nodes.values() if node.online and node.cordoned))
    need_mib = job.gpu_memory_mib or 0
    biggest_gpu = max((gpu.memory_mib for node in online for gpu in node.gpus), default=0)
    if need_mib > biggest_gpu:  # (the largest of any model: the models asked for are not looked at here)
        return reasons.no_gpu_with_memory(need_mib, biggest_gpu, frozenset())
    per_node = [len(_fitting(job, list(node.gpus))) for node in online]
    if job.max_nodes == 1 and job.gpus > max(per_node):
        return reasons.gang_larger_than_any_node(job.gpus, max(per_node), 1, one_model=False)
    reachable = sum(sorted(per_node, reverse=True)[: job.max_nodes or None])
    if job.gpus > reachable:
        return reasons.gang_larger_than_cluster(job.gpus, reachable, one_model=False)
    most_free = max((len(_fitting(job, gpus)) for gpus in free.values()), default=0)
    return reasons.waiting_for_free_gpus(job.gpus, need_mib, job.max_nodes == 1, most_free)
