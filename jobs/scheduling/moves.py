"""Crowded borrowers move to GPUs left empty (``config.move_crowded_borrowers``).

A one-GPU borrower placed while the cluster was full shares its GPU: throttled beside a guaranteed
job, or slowed by another borrower. When GPUs free up later, nothing moves it, and it crawls at the
duty cycle floor for the rest of its run (on Philly a 5.5 h job took 43 h). After both passes, a
GPU of its model that is still empty is one nobody queued could use; a borrower that checkpoints
is preempted then, and the next cycle places it there alone. The most throttled go first, then
those with the longest left to run; one per crowded GPU (the job left behind has room enough).
"""

from __future__ import annotations

from collections import defaultdict

from jobs.scheduling.capacity import Capacity
from jobs.scheduling.decisions import Preempt, PreemptReason
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobClass, RunningJob


def crowded_borrowers(capacity: Capacity, running: tuple[RunningJob, ...], leaving: set[int],
                      now: float) -> list[Preempt]:
    """The preemptions that move crowded borrowers; each victim is added to ``leaving``."""
    empty: dict[str, int] = defaultdict(int)
    for node in capacity.nodes:
        if node.indexed:
            for gpu in node.empty:
                if not gpu.blocked and gpu.occupants == 0:
                    empty[gpu.model] += 1
    if not empty:
        return []
    crowded = []
    for job in running:
        if (job.job_class is not JobClass.OPPORTUNISTIC or job.id in leaving or not job.checkpoints
                or len(job.gpu_ids) != 1):
            continue
        gpu = capacity.by_id.get(job.gpu_ids[0])
        if gpu is None or gpu.occupants < 2 or gpu.requested_milli <= WHOLE_GPU_MILLI:
            continue
        remaining = 0.0 if job.expected_end is None else job.expected_end - now
        crowded.append((job.duty_cycle, -remaining, job.id, job, gpu))
    crowded.sort(key=lambda entry: entry[:3])
    moved: set[int] = set()
    preemptions = []
    for *_, job, gpu in crowded:
        if empty[gpu.model] <= 0 or gpu.id in moved:
            continue
        empty[gpu.model] -= 1
        moved.add(gpu.id)
        leaving.add(job.id)  # (it stops: no duty cycle for it any more)
        preemptions.append(Preempt(job.id, PreemptReason.MOVE_TO_EMPTY_GPU,
                                   "A GPU is free: the job restarts there from its checkpoint, alone"))
    return preemptions
