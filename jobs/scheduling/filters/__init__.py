"""The constraints a placement must meet, one module each (after the Kubernetes scheduler
framework's filter plugins), each exposing a ``FILTER`` that matches ``protocol.Filter``: a name
and the hooks its constraint has of

* ``admits_pool(pool, shape)``: a static test on an index pool (GPU model, memory, link speed,
  container runtime, MIG profile), so the placer looks only at pools that can hold the request;
* ``admits_shared_gpu(gpu, shape, job_class, config)``: may the request join a GPU that already
  has residents;
* ``gpus_on(node, shape)``: how many of the request's GPUs a node can take now;
* ``never(check, shape)``: the reason the request can run nowhere on this inventory (``check`` is
  ``explain.InventoryCheck``), or None.

``FILTERS`` is the registry, in the order a researcher should hear the inventory reasons (what is
missing everywhere first, then what only some nodes lack); ``BY_NAME`` finds one. The placer, the
explainer, the reclaimer and ``capacity`` all ask these filters, so a new constraint is a new
module plus its line in ``FILTERS``. The combined hooks below call only the filters that offer
each hook, through tuples made once at import: the indexes in ``capacity`` stay the fast path and
these predicates are what the placer checks each candidate with.
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
from jobs.scheduling.filters.protocol import OK, UNLIMITED, Filter, NamedFilter, Status

FILTERS: tuple[Filter, ...] = (
    isolation.FILTER, gpu_model.FILTER, gpu_memory.FILTER, gang_width.FILTER, container_runtime.FILTER,
    host_resources.FILTER, compute_room.FILTER, exclusivity.FILTER, cordon.FILTER,
)
BY_NAME: dict[str, Filter] = {f.name: f for f in FILTERS}


def _offering(hook: str) -> tuple:
    return tuple(getattr(f, hook) for f in FILTERS if f.offers(hook))


_POOL_HOOKS, _SHARED_HOOKS = _offering("admits_pool"), _offering("admits_shared_gpu")
_GPUS_ON_HOOKS, _NEVER_HOOKS = _offering("gpus_on"), tuple((f.name, f.never) for f in FILTERS if f.offers("never"))


def pool_key(shape) -> tuple:
    """Everything ``admits_pool`` reads of a request: equal keys admit the same pools."""
    return (shape.models, shape.memory_mib, shape.gpu_milli, shape.needs_runtime, shape.mig_profile)


def admits_pool(pool, shape) -> bool:
    for admits in _POOL_HOOKS:
        if not admits(pool, shape):
            return False
    return True


def admits_shared_gpu(gpu, shape, job_class, config) -> bool:
    for admits in _SHARED_HOOKS:
        if not admits(gpu, shape, job_class, config):
            return False
    return True


def _fewest_gpus_on(node, shape) -> int:
    return min(gpus_on(node, shape) for gpus_on in _GPUS_ON_HOOKS)


# (one filter limits GPUs per node today: its hook is the combined one, no call in between)
gpus_on = _GPUS_ON_HOOKS[0] if len(_GPUS_ON_HOOKS) == 1 else _fewest_gpus_on


def unschedulable(check, shape) -> Status:
    """The first filter, in ``FILTERS`` order, that no node of ``check``'s inventory passes."""
    for name, never in _NEVER_HOOKS:
        reason = never(check, shape)
        if reason is not None:
            return Status(reason, name)
    return OK


__all__ = ["BY_NAME", "FILTERS", "OK", "UNLIMITED", "Filter", "NamedFilter", "Status", "admits_pool",
           "admits_shared_gpu", "cordon", "gpus_on", "pool_key", "unschedulable"]
