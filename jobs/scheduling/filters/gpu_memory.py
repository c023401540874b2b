"""Filter: GPU memory. An empty GPU must hold the request; a GPU with residents must hold it plus
``share_memory_headroom_mib`` next to what they use (their observed peak or their request)."""

from __future__ import annotations

from jobs.scheduling import reasons


def admits_pool(pool, shape) -> bool:
    return shape.memory_on(pool[1]) <= pool[1]


def admits_shared_gpu(gpu, shape, headroom: int) -> bool:
    return gpu.free_mib >= shape.memory_on(gpu.capacity_mib) + headroom


def never(check, shape):
    # An image job is judged on every node here; whether the nodes with a runtime fit it is
    # ``container_runtime``'s question.
    pools = check.pools(check.without_runtime(shape))
    # (``pools`` spans every node: ones that exist only on cordoned or offline nodes fit nothing here.)
    if not pools or (shape.gpus == 1 and not check.node_widths(pools)[0]):
        largest = max(mib for model, mib in check.largest_mib.items() if not shape.models or model in shape.models)
        return reasons.no_gpu_with_memory(shape.memory_mib or 0, largest, shape.models)
    return None
