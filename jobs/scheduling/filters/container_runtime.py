"""Filter: a job with an image runs only on nodes whose agent advertises a container runtime
(docker, podman or apptainer)."""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters import gang_width
from jobs.scheduling.filters.protocol import NamedFilter


def admits_pool(pool, shape) -> bool:
    return pool.has_runtime or not shape.needs_runtime


def never(check, shape):
    """Asked only once the request fits the inventory as a whole: do the runtime nodes fit it?"""
    if not shape.needs_runtime:
        return None
    for model_pools in check.models_of(check.pools(shape)):
        if gang_width.fits_widths(check.node_widths(model_pools), shape):
            return None
    return reasons.needs_container_runtime(check.runtime_nodes, shape.gpus)


FILTER = NamedFilter("container_runtime", admits_pool=admits_pool, never=never)
