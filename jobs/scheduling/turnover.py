"""Turnover among borrowers: borrowed GPUs go to the least served first.

Least attained service (Tiresias, Gu et al., NSDI'19) finishes short jobs early, and most jobs
are short: on the Philly windows LAS's average JCT beat Colony's by an hour, with the same
queueing, because Colony started a newcomer beside a busy borrower (both slowed) where LAS
preempted the most served job and ran the newcomer alone. So a borrower that has had less than
``borrower_turnover_gpu_s`` of service, and that the placer could only put on a GPU it would
over-commit, first tries to preempt borrowers past that much service that checkpoint (they
resume where they were): the same search a guarantee's reclaim makes (``reclaim.Reclaimer``),
over those victims only. Guaranteed work is never a victim, nor is a job that does not
checkpoint, nor a borrower of a tenant down to its own guarantee. The victims are the most served
in all first, earlier runs included, as LAS takes them (``config.turnover_most_served_first``):
a checkpointing victim loses little whoever it is, and least progress lost first (a guarantee's
rule: the shortest current run) took a job just restarted however much service it had had.

The freed GPUs are promised to the newcomer, as a guarantee's reclaim promises them
(``GuaranteedPass.keep_promises`` places it there first, as a borrower): left to the borrowers in
fair-share order, a victim took its GPU back and was preempted again (2,943 preemptions on a
1,000-job Philly window, against 141 promised). A victim waits in its tenant's queue like any
other job, its service counted: it preempts no one until the newcomers have had theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobs.scheduling.placement import Choice, Shape
from jobs.scheduling.capacity import GpuSlot, NodeSlot
from jobs.scheduling.reclaim import NO_LOSS, Loss, Reclaim, Reclaimer, total_loss, youngest_first
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobClass, JobRequest, RunningJob

OPPORTUNISTIC = JobClass.OPPORTUNISTIC


def over_commits(choice: Choice, shape: Shape) -> bool:
    """Whether the placement asks more of a GPU than what is left of it after its residents' requests."""
    return any(gpu.requested_milli + shape.gpu_milli > WHOLE_GPU_MILLI for _, gpus in choice.slices for gpu in gpus)


class Turnover:
    def __init__(self, reclaimer: Reclaimer, served_gpu_s: float):
        self.reclaimer = reclaimer
        self.served_gpu_s = served_gpu_s

    @classmethod
    def of(cls, capacity, placer, config, now: float, borrowed: dict[str, int], leaving: set[int],
           charged: dict[int, int] | None, served: Mapping[int, float] | None,
           running: Sequence[RunningJob]) -> "Turnover | None":
        """``borrowed``, ``leaving`` and ``charged`` are the cycle's own (shared with its reclaims);
        ``served``: the running jobs' service in this run where measured (``LiveReadings.served_gpu_s``);
        ``running``: the snapshot's running jobs (the capacity's residents)."""
        threshold = config.borrower_turnover_gpu_s
        if threshold <= 0:
            return None
        return cls(_MostServed(capacity, placer, config, now, borrowed, leaving, charged, threshold=threshold,
                               served={} if served is None else served, running=running), threshold)

    def wants(self, job: JobRequest, shape: Shape, choice: Choice) -> bool:
        return job.attained_gpu_s < self.served_gpu_s and over_commits(choice, shape)

    def find(self, job_id: int, shape: Shape) -> Reclaim | None:
        return self.reclaimer.find(job_id, shape)


class _MostServed(Reclaimer):
    """A reclaimer whose victims are borrowers served past ``threshold`` GPU-seconds that checkpoint."""

    def __init__(self, *args, threshold: float, served: Mapping[int, float], running: Sequence[RunningJob]):
        super().__init__(*args)
        self.threshold, self.served, self.running = threshold, served, running
        # Per node (by key), its GPUs where no resident is kept: a resident that can never be a
        # victim this cycle (guaranteed, no checkpoint, served less than the threshold) and is not
        # leaving makes the GPU no use. A cycle asks the same GPUs again for every shape whose
        # turnover fails (17 shapes x 3,400 GPUs a steady cycle at 1,024 nodes); made again when
        # ``leaving`` grows (residents leave a cycle only that way).
        self._open: dict[int, list[GpuSlot]] = {}
        self._open_at = -1
        # The keys of the nodes that may have such a GPU (``_may_have_open_gpus``).
        self._open_nodes: set[int] | None = None
        self._open_nodes_at = -1

    def find(self, job_id: int, shape: Shape, keep=None) -> Reclaim | None:
        if not self._may_have_open_gpus():
            return None  # (what the search finds: no node offers a GPU)
        return super().find(job_id, shape, keep)

    def _evaluate(self, nodes: list[NodeSlot], shape: Shape, pools: list[int], enough: int):
        maybe = self._may_have_open_gpus()
        return super()._evaluate([node for node in nodes if node.key in maybe], shape, pools, enough)

    def _may_have_open_gpus(self) -> set[int]:
        """The keys of the nodes where ``_gpus_of`` may find a GPU: those with an empty one, and
        those of the residents leaving or served past the threshold. The rest offer nothing, and
        a busy cluster often has neither (no empty GPU, no borrower served an hour): every
        turnover then fails at once, where each of 18 a steady cycle at 1,024 nodes asked some 430
        nodes. (Nothing this set leaves out opens within the cycle: a placement fills GPUs, and
        a job placed is no GPU's resident; it is made again when ``leaving`` grows.)"""
        if self._open_nodes_at != len(self.leaving):
            leaving, may_be_victim, by_id = self.leaving, self._may_be_victim, self.capacity.by_id
            found = {node.key for node in self.capacity.nodes if node.empty}
            for job in self.running:
                if job.id in leaving or may_be_victim(job):
                    found.update(gpu.node.key for gpu_id in job.gpu_ids if (gpu := by_id.get(gpu_id)) is not None)
            self._open_nodes, self._open_nodes_at = found, len(self.leaving)
        return self._open_nodes

    def _gpus_of(self, node: NodeSlot) -> list[GpuSlot]:
        if self._open_at != len(self.leaving):
            self._open.clear()
            self._open_at = len(self.leaving)
        found = self._open.get(node.key)
        if found is None:
            leaving, may_be_victim = self.leaving, self._may_be_victim
            found = self._open[node.key] = [
                gpu for gpu in node.gpus
                if all(j.id in leaving or may_be_victim(j) for j in gpu.residents)]
        return found

    def _gpu_victims(self, gpu: GpuSlot, shape: Shape, pools: list[int]) -> tuple[Loss, list[RunningJob]] | None:
        """Everyone on the GPU leaves or it is no use: the newcomer is to run alone on it (a
        guarantee's reclaim frees memory; this frees the GPU's compute)."""
        if gpu.blocked or gpu.pool not in pools or gpu.exclusive:
            return None
        if gpu.occupants == 0:
            return NO_LOSS, []
        evictable = [j for j in gpu.residents if j.id not in self.leaving and self._evictable(j)]
        leaving = sum(1 for j in gpu.residents if j.id in self.leaving)
        if leaving + len(evictable) < gpu.occupants:
            return None
        return total_loss(self._progress(j) for j in evictable), youngest_first(evictable)

    def _progress(self, job: RunningJob) -> Loss:
        if not (self.config.turnover_most_served_first and job.checkpoints):
            return super()._progress(job)  # (a job that does not checkpoint is no victim; node estimates count it)
        return 0.0, -self._served(job)  # (less is better: the most served cost the least)

    def _served(self, job: RunningJob) -> float:
        served = self.served.get(job.id)
        if served is None:
            served = max(0.0, self.now - job.started_at) * job.quota_milli / WHOLE_GPU_MILLI
        return job.attained_gpu_s + served

    def _evictable(self, job: RunningJob) -> bool:
        return self._may_be_victim(job) and super()._evictable(job)

    def _may_be_victim(self, job: RunningJob) -> bool:
        """What makes a victim that does not move within a cycle (``_evictable`` adds what does:
        its tenant's borrowing)."""
        return job.checkpoints and job.job_class is OPPORTUNISTIC and self._served(job) >= self.threshold

