"""The constraints a placement must meet, one module each (after the Kubernetes scheduler
framework's filter plugins). A filter offers what it can of:

* ``admits_pool(pool, shape)``: a static test on an index pool (GPU model, memory, link speed,
  container runtime), so the placer looks only at pools that can hold the request;
* ``admits_shared_gpu(gpu, shape, ...)``: may the request join a GPU that already has residents;
* ``gpus_on(node, shape)``: how many of the request's GPUs a node can take now;
* ``never(check, shape)``: the reason the request can run nowhere on this inventory (``check`` is
  ``explain.InventoryCheck``), or None.

The placer (``placement``) and the explainer (``explain``) both go through the functions below,
so a new constraint is a new module plus its line here. The indexes in ``capacity`` stay the
fast path; these predicates are what the placer checks each candidate with.
"""

from __future__ import annotations

from jobs.scheduling.filters import (
    compute_room,
    container_runtime,
    cordon,
    exclusivity,
    gang_width,
    gpu_memory,
    gpu_model,
    host_resources,
    isolation,
)

# Inventory reasons, in the order a researcher should hear them: what is missing everywhere first,
# then what only some nodes lack.
NEVER = (isolation.never, gpu_model.never, gpu_memory.never, gang_width.never, container_runtime.never, host_resources.never)


def pool_key(shape) -> tuple:
    """Everything ``admits_pool`` reads of a request: equal keys admit the same pools."""
    return (shape.models, shape.memory_mib, shape.gpu_milli, shape.needs_runtime, shape.mig_profile)


def admits_pool(pool, shape) -> bool:
    return gpu_model.admits_pool(pool, shape) and gpu_memory.admits_pool(pool, shape) \
        and container_runtime.admits_pool(pool, shape) and isolation.admits_pool(pool, shape)


def admits_shared_gpu(gpu, shape, job_class, config) -> bool:
    return (gang_width.admits_shared_gpu(shape)
            and gpu_memory.admits_shared_gpu(gpu, shape)
            and compute_room.admits_shared_gpu(gpu, shape, job_class, config.max_shared_load_milli,
                                               config.min_shared_room_milli)
            and exclusivity.admits_shared_gpu(gpu, shape, job_class)
            and isolation.admits_shared_gpu(gpu, shape))


def gpus_on(node, shape) -> int:
    return host_resources.gpus_on(node, shape)


__all__ = ["NEVER", "admits_pool", "admits_shared_gpu", "cordon", "gpus_on", "pool_key"]
