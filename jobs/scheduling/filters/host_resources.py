"""Filter: the node's CPU and host memory, by request (what jobs asked for, not what they use).

A GPU is only as useful as the cores and RAM that feed it: FGD (Weng et al., ATC'23) enforces both,
and a scheduler that ignores them overcommits nodes whose GPUs look free. A request needs
``ceil(total / gpus)`` of each per GPU, so a gang spread over nodes takes them in proportion to its
GPUs on each. A node that does not report a resource (``None``) is never short of it.

``gpus_allowed`` is what the placer asks ("how many of this request's GPUs can this node feed?");
``shortage`` is what a waiting job is told when GPUs were free but the node could not feed them.
"""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import UNLIMITED, NamedFilter


def per_gpu(total: int, gpus: int) -> int:
    return -(-total // gpus) if total > 0 and gpus > 0 else 0


def gpus_on(node, shape) -> int:
    """How many of this request's GPUs ``node`` has the CPU and host memory for now."""
    if not (shape.cpu_per_gpu or shape.host_mb_per_gpu):
        return UNLIMITED
    return gpus_allowed(node, shape.cpu_per_gpu, shape.host_mb_per_gpu)


def gpus_allowed(node, cpu_per_gpu: int, memory_per_gpu: int, freed_cpu: int = 0, freed_memory: int = 0) -> int:
    """How many GPUs' worth of this request ``node`` (a ``capacity.NodeSlot``) can feed now;
    ``freed_*``: what jobs about to leave it release."""
    allowed = UNLIMITED
    if cpu_per_gpu and node.cpu_free is not None:
        allowed = (node.cpu_free + freed_cpu) // cpu_per_gpu
    if memory_per_gpu and node.host_free_mb is not None:
        allowed = min(allowed, (node.host_free_mb + freed_memory) // memory_per_gpu)
    return max(allowed, 0)


def gpus_ever_allowed(node, cpu_per_gpu: int, memory_per_gpu: int) -> int:
    """As ``gpus_allowed`` on an empty node: what the node's whole CPU and memory can feed."""
    allowed = UNLIMITED
    if cpu_per_gpu and node.cpu_total is not None:
        allowed = node.cpu_total // cpu_per_gpu
    if memory_per_gpu and node.host_total_mb is not None:
        allowed = min(allowed, node.host_total_mb // memory_per_gpu)
    return allowed


def shortage(nodes, cpu_per_gpu: int, memory_per_gpu: int, gpus_per_node: int) -> str | None:
    """Which resource keeps ``gpus_per_node`` GPUs' worth of the request off ``nodes``: "cpu"
    first, then "memory"; None when they can feed it."""
    for node in nodes:
        if cpu_per_gpu and node.cpu_free is not None and node.cpu_free < cpu_per_gpu * gpus_per_node:
            return "cpu"
    for node in nodes:
        if memory_per_gpu and node.host_free_mb is not None and node.host_free_mb < memory_per_gpu * gpus_per_node:
            return "memory"
    return None


def take(node, cpu_milli: int, memory_mb: int) -> None:
    """Account a job's share on ``node``."""
    if node.cpu_free is not None:
        node.cpu_free -= cpu_milli
    if node.host_free_mb is not None:
        node.host_free_mb -= memory_mb


def never(check, shape):
    """The GPUs exist: can the nodes that have them feed the request with all their CPU and memory?"""
    if not (shape.cpu_per_gpu or shape.host_mb_per_gpu):
        return None

    def fed(cpu: int, memory: int) -> bool:
        for model_pools in check.models_of(check.pools(shape)):
            per_node = sorted((min(sum(1 for g in n.gpus if g.pool in model_pools), gpus_ever_allowed(n, cpu, memory))
                               for n in check.schedulable), reverse=True)
            within = sum(per_node[: shape.max_nodes] if shape.max_nodes is not None else per_node)
            if within >= shape.gpus:
                return True
        return False

    if fed(shape.cpu_per_gpu, shape.host_mb_per_gpu):
        return None
    resource = "cpu" if not fed(shape.cpu_per_gpu, 0) else "memory"
    totals = [n.cpu_total if resource == "cpu" else n.host_total_mb for n in check.schedulable]
    per_gpu_need = shape.cpu_per_gpu if resource == "cpu" else shape.host_mb_per_gpu
    return reasons.no_node_with_enough_host(resource, per_gpu_need * shape.gpus,
                                            max((t for t in totals if t is not None), default=None))


FILTER = NamedFilter("host_resources", gpus_on=gpus_on, never=never)
