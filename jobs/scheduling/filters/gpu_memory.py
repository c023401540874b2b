"""Filter: GPU memory. An empty GPU must hold the request; a GPU with residents must hold it plus
a margin next to what they use (their observed peak or their request): ``share_memory_headroom_mib``
unless the newcomer and every resident are fractions held to their share of the GPU."""

from __future__ import annotations

from jobs.scheduling import reasons


def admits_pool(pool, shape) -> bool:
    return shape.memory_on(pool[1]) <= pool[1]


def admits_shared_gpu(gpu, shape) -> bool:
    return gpu.free_mib >= shape.memory_on(gpu.capacity_mib) + max(shape.headroom_mib, gpu.margin_mib)


def never(check, shape):
    # An image job is judged on every node here; whether the nodes with a runtime fit it is
    # ``container_runtime``'s question.
    pools = check.pools(check.without_runtime(shape))
    # (``pools`` spans every node: ones that exist only on cordoned or offline nodes fit nothing here.)
    if not pools or (shape.gpus == 1 and not check.node_widths(pools)[0]):
        largest = max(mib for model, mib in check.largest_mib.items() if not shape.models or model in shape.models)
        return reasons.no_gpu_with_memory(shape.memory_mib or 0, largest, shape.models)
    return None
