"""Filter: a gang needs that many GPUs of one model (its ranks move in lockstep, so one slower
model holds every rank back) on at most ``max_nodes`` nodes. A gang takes empty GPUs only: in a
ring all-reduce the slowest rank paces every other one, so one shared GPU slows the whole gang."""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import NamedFilter


def admits_shared_gpu(gpu, shape, job_class=None, config=None) -> bool:
    return shape.gpus == 1


def fits_widths(per_node: list[int], shape) -> bool:
    """Do nodes offering ``per_node`` usable GPUs (widest first) hold the gang?"""
    within = sum(per_node[: shape.max_nodes]) if shape.max_nodes is not None else sum(per_node)
    return within >= shape.gpus


def never(check, shape):
    if shape.gpus == 1:
        return None
    widest = total = 0
    for model_pools in check.models_of(check.pools(check.without_runtime(shape))):
        per_node = check.node_widths(model_pools)
        if fits_widths(per_node, shape):
            return None
        widest, total = max(widest, per_node[0] if per_node else 0), max(total, sum(per_node))
    if shape.max_nodes is not None:
        return reasons.gang_larger_than_any_node(shape.gpus, widest, shape.max_nodes)
    return reasons.gang_larger_than_cluster(shape.gpus, total)


FILTER = NamedFilter("gang_width", admits_shared_gpu=admits_shared_gpu, never=never)
