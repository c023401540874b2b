"""Filter: a guaranteed job never joins another guaranteed job unless both allow sharing
(``shareable`` or fractional), and then only while their guaranteed milli-GPUs sum to at most one
GPU; a non-shareable guaranteed job joins only GPUs without guaranteed residents (next to
opportunistic work, which is then throttled). Opportunistic work is judged by ``compute_room``."""

from __future__ import annotations

from jobs.scheduling.filters.protocol import NamedFilter
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobClass


def admits_shared_gpu(gpu, shape, job_class, config=None) -> bool:
    if job_class is JobClass.OPPORTUNISTIC:
        return True
    if shape.shareable:
        return not gpu.exclusive and gpu.guaranteed_milli + shape.gpu_milli <= WHOLE_GPU_MILLI
    return gpu.guaranteed_count == 0


def holds_alone(job_class, shareable: bool) -> bool:
    """Does a job of this class and sharing term keep every other guaranteed job off its GPUs
    (``GpuSlot.exclusive``)? ``shareable``: the job allows sharing or asks a fraction."""
    return job_class is JobClass.GUARANTEED and not shareable


FILTER = NamedFilter("exclusivity", admits_shared_gpu=admits_shared_gpu)
