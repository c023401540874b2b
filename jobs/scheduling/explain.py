"""Reasons a request cannot run on this cluster whatever the load: bad request, no node online, or
a filter (``filters.unschedulable``: MIG isolation, GPU model, GPU memory, gang width, container
runtime, CPU and host memory) that no schedulable node passes; a cordon is named when only cordoned nodes would.

Checked once per distinct request shape against the schedulable inventory (not against what is
free), so the answer is the same until nodes come, go or get cordoned. The load-dependent reasons
(quota, waiting, reserved, reclaiming) are decided by the cycle itself.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

from jobs.scheduling import filters, reasons
from jobs.scheduling.capacity import Capacity
from jobs.scheduling.placement import Placer, Shape
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobRequest


def invalid_request(job: JobRequest) -> PendingReason | None:
    if job.gpus < 1:
        return reasons.invalid_request(f"asks for {job.gpus} GPUs")
    if not 0 < job.gpu_milli <= WHOLE_GPU_MILLI:
        return reasons.invalid_request(f"gpu_milli must be 1..1000, not {job.gpu_milli}")
    if job.gpu_milli < WHOLE_GPU_MILLI and job.gpus != 1:
        return reasons.invalid_request("a fraction of a GPU can only be asked for one GPU")
    if job.max_nodes is not None and job.max_nodes < 1:
        return reasons.invalid_request(f"max_nodes must be at least 1, not {job.max_nodes}")
    if job.cpu_milli < 0 or job.host_memory_mb < 0:
        return reasons.invalid_request("CPU and host memory cannot be negative")
    return None


class InventoryCheck:
    """What the filters' ``never`` checks read of the inventory (``nodes``: the nodes to check
    against; default: the schedulable ones), with the per-cycle memos they share."""

    def __init__(self, capacity: Capacity, placer: Placer, nodes=None):
        self.capacity = capacity
        self.placer = placer
        self.schedulable = [n for n in capacity.nodes if n.schedulable] if nodes is None else list(nodes)
        # Cordoned nodes are checked only when the request fits nowhere else, to tell its owner
        # that the cordon, not the request, is what keeps it waiting.
        self.cordoned = [n for n in capacity.nodes if n.cordoned] if nodes is None else []
        self._with_cordoned: InventoryCheck | None = None
        self._memo: dict[tuple, PendingReason | None] = {}
        self._widths: dict[tuple[int, ...], list[int]] = {}
        self._plain: dict[Shape, Shape] = {}

    # The facts below are read only to word a reason for a request shape seen for the first time:
    # with the scheduler's carry, most cycles see none and never build them.

    @cached_property
    def _profiles(self) -> list[tuple[str, str]]:
        """(model, MIG profile or "") of every schedulable GPU."""
        return [(g.model, self.capacity.pools[g.pool].mig_profile) for n in self.schedulable for g in n.gpus]

    @cached_property
    def online_models(self) -> list[str]:
        # MIG instances serve only requests for their profile, so they never make a model "online".
        return sorted({model for model, profile in self._profiles if not profile})

    @cached_property
    def online_mig_models(self) -> list[str]:
        return sorted({model for model, profile in self._profiles if profile})

    @cached_property
    def online_mig_profiles(self) -> list[str]:
        return sorted({profile for _, profile in self._profiles} - {""})

    @cached_property
    def largest_mib(self) -> dict[str, int]:
        largest: dict[str, int] = {}
        for node in self.schedulable:
            for gpu in node.gpus:
                largest[gpu.model] = max(largest.get(gpu.model, 0), gpu.capacity_mib)
        return largest

    @cached_property
    def runtime_nodes(self) -> list[str]:
        return sorted(n.name for n in self.schedulable if n.has_runtime)

    def reason(self, shape: Shape) -> PendingReason | None:
        # What matters is which pools the request can use, not its exact numbers.
        pools = tuple(self.placer.pools_for(shape))
        # The memory is named in the reason when no GPU that holds it takes work (none exists, or
        # only on nodes that are offline or cordoned, or the request needs a runtime).
        widths = self.node_widths(pools) if pools and shape.gpus == 1 else None
        named = not pools or shape.needs_runtime or (widths is not None and not (widths and widths[0]))
        key = (pools, shape.models, shape.mig_profile, shape.gpus, shape.max_nodes,
               shape.memory_mib if named else None, shape.needs_runtime, shape.cpu_per_gpu, shape.host_mb_per_gpu)
        if key not in self._memo:
            self._memo[key] = filters.cordon.explain(self, shape, self._reason(shape))
        return self._memo[key]

    def _reason(self, shape: Shape) -> PendingReason | None:
        if not self.schedulable:
            cordoned = sum(1 for n in self.capacity.nodes if not n.schedulable)
            return reasons.no_nodes_online(len(self.capacity.nodes), cordoned)
        return filters.unschedulable(self, shape).reason

    # -- what the filters read -------------------------------------------------------------------

    def with_cordoned(self) -> InventoryCheck:
        if self._with_cordoned is None:
            self._with_cordoned = InventoryCheck(self.capacity, self.placer, nodes=[*self.schedulable, *self.cordoned])
        return self._with_cordoned

    def pools(self, shape: Shape) -> list[int]:
        return self.placer.pools_for(shape)

    def models_of(self, pools: list[int]) -> list[list[int]]:
        return self.placer.pools_by_model(pools)

    def node_widths(self, pools: list[int]) -> list[int]:
        """Usable GPUs per checked node for these pools, widest first."""
        key = tuple(pools)
        if key not in self._widths:
            self._widths[key] = sorted((sum(1 for g in n.gpus if g.pool in pools) for n in self.schedulable),
                                       reverse=True)
        return self._widths[key]

    def without_runtime(self, shape: Shape) -> Shape:
        """The same request without its image (so the runtime is named only when it is what is missing)."""
        if not shape.needs_runtime:
            return shape
        plain = self._plain.get(shape)
        if plain is None:
            plain = self._plain[shape] = replace(shape, needs_runtime=False)
        return plain
