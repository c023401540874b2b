"""Filter: GPU memory. An empty GPU must hold the request; a GPU with residents must hold it plus
a margin next to what they use (their observed peak or their request): ``share_memory_headroom_mib``
unless the newcomer and every resident are fractions held to their share of the GPU."""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import NamedFilter


def admits_pool(pool, shape) -> bool:
    return shape.memory_on(pool.memory_mib) <= pool.memory_mib


def needed_mib(gpu, shape, beside_residents: bool) -> int:
    """The free memory ``gpu`` must have for the request: its memory there, plus the margin when
    residents stay beside it (the larger of the newcomer's and the residents' own)."""
    need = shape.memory_on(gpu.capacity_mib)
    return need + max(shape.headroom_mib, gpu.margin_mib) if beside_residents else need


def admits_shared_gpu(gpu, shape, job_class=None, config=None) -> bool:
    return gpu.capacity_mib - gpu.used_mib >= needed_mib(gpu, shape, True)


def fills_gpu(gpu, shape) -> bool:
    """Does the request with its own margin need more than ``gpu`` holds beside anyone at all?"""
    return shape.memory_on(gpu.capacity_mib) + shape.headroom_mib > gpu.capacity_mib


def never(check, shape):
    # An image job is judged on every node here; whether the nodes with a runtime fit it is
    # ``container_runtime``'s question.
    pools = check.pools(check.without_runtime(shape))
    # (``pools`` spans every node: ones that exist only on cordoned or offline nodes fit nothing here.)
    if not pools or (shape.gpus == 1 and not check.node_widths(pools)[0]):
        largest = max(mib for model, mib in check.largest_mib.items() if not shape.models or model in shape.models)
        return reasons.no_gpu_with_memory(shape.memory_mib or 0, largest, shape.models)
    return None


FILTER = NamedFilter("gpu_memory", admits_pool=admits_pool, admits_shared_gpu=admits_shared_gpu, never=never)
