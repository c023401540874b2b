"""What a filter is: a name and up to four typed hooks (the Kubernetes scheduler framework's filter
plugin, ``plugins/nodename/node_name.go``), and the ``Status`` an inventory check returns.

A filter offers only the hooks its constraint has; ``NamedFilter`` fills the others with neutral
ones (admit everything, limit nothing, never object), and the registry (``filters.FILTERS``)
leaves a filter out of a hook it does not offer, so a neutral hook costs nothing on the placer's
hot path. Pure: nothing here reads the clock, the database or Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # (types only: the filters must not import the modules that import them)
    from jobs.scheduling.capacity import GpuSlot, NodeSlot, Pool
    from jobs.scheduling.config import SchedulerConfig
    from jobs.scheduling.explain import InventoryCheck
    from jobs.scheduling.placement import Shape
    from jobs.scheduling.reasons import PendingReason
    from jobs.scheduling.snapshot import JobClass

# A node that does not limit how many of a request's GPUs it takes (``gpus_on``).
UNLIMITED = 1 << 30


class Filter(Protocol):
    name: str

    def admits_pool(self, pool: Pool, shape: Shape) -> bool:
        """A static test on an index pool (model, memory, link, runtime, MIG profile): the placer
        looks only at pools every filter admits."""

    def admits_shared_gpu(self, gpu: GpuSlot, shape: Shape, job_class: JobClass, config: SchedulerConfig) -> bool:
        """May the request join ``gpu``, which already has residents?"""

    def gpus_on(self, node: NodeSlot, shape: Shape) -> int:
        """How many of the request's GPUs ``node`` can take now."""

    def never(self, check: InventoryCheck, shape: Shape) -> PendingReason | None:
        """Why the request can run nowhere on this inventory, or None."""


def admits_any_pool(pool, shape) -> bool:
    return True


def admits_any_shared_gpu(gpu, shape, job_class, config) -> bool:
    return True


def no_gpu_limit(node, shape) -> int:
    return UNLIMITED


def never_objects(check, shape) -> None:
    return None


NEUTRAL = {"admits_pool": admits_any_pool, "admits_shared_gpu": admits_any_shared_gpu, "gpus_on": no_gpu_limit,
           "never": never_objects}


@dataclass(frozen=True, slots=True)
class NamedFilter:
    """A filter as a value: its name and the hooks it offers (the rest neutral). Matches ``Filter``."""

    name: str
    admits_pool: Callable = admits_any_pool
    admits_shared_gpu: Callable = admits_any_shared_gpu
    gpus_on: Callable = no_gpu_limit
    never: Callable = never_objects

    def offers(self, hook: str) -> bool:
        return getattr(self, hook) is not NEUTRAL[hook]


@dataclass(frozen=True, slots=True)
class Status:
    """What a filter says of a request: ok, or the reason it fails and the filter that said so."""

    reason: PendingReason | None = None
    filter: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


OK = Status()
