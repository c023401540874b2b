"""Reasons a request cannot run on this cluster whatever the load: bad request, no node online,
no GPU of the wanted model, none with enough memory, a gang wider than the cluster allows, an
image job that no node with a container runtime can take.

Checked once per distinct request shape against the schedulable inventory (not against what is
free), so the answer is the same until nodes come, go or get cordoned. The load-dependent reasons
(quota, waiting, reserved, reclaiming) are decided by the cycle itself.
"""

from __future__ import annotations

from dataclasses import replace

from jobs.scheduling import reasons
from jobs.scheduling.capacity import Capacity
from jobs.scheduling.filters import host_resources
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
    """``nodes``: the inventory to check against (default: the schedulable nodes)."""

    def __init__(self, capacity: Capacity, placer: Placer, nodes=None):
        self.capacity = capacity
        self.placer = placer
        self.schedulable = [n for n in capacity.nodes if n.schedulable] if nodes is None else list(nodes)
        # Cordoned nodes are checked only when the request fits nowhere else, to tell its owner
        # that the cordon, not the request, is what keeps it waiting.
        self.cordoned = [n for n in capacity.nodes if n.cordoned] if nodes is None else []
        self._with_cordoned: InventoryCheck | None = None
        self.online_models = sorted({g.model for n in self.schedulable for g in n.gpus})
        self.largest_mib: dict[str, int] = {}
        for node in self.schedulable:
            for gpu in node.gpus:
                self.largest_mib[gpu.model] = max(self.largest_mib.get(gpu.model, 0), gpu.capacity_mib)
        self._memo: dict[tuple, PendingReason | None] = {}
        self._widths: dict[tuple[int, ...], list[int]] = {}
        self.runtime_nodes = sorted(n.name for n in self.schedulable if n.has_runtime)
        self._plain: dict[Shape, Shape] = {}

    def reason(self, shape: Shape) -> PendingReason | None:
        # What matters is which pools the request can use, not its exact numbers.
        pools = tuple(self.placer.pools_for(shape))
        key = (pools, shape.models, shape.gpus, shape.max_nodes,
               None if pools and not shape.needs_runtime else shape.memory_mib, shape.needs_runtime,
               shape.cpu_per_gpu, shape.host_mb_per_gpu)
        if key not in self._memo:
            self._memo[key] = self._reason_or_cordon(shape)
        return self._memo[key]

    def _reason_or_cordon(self, shape: Shape) -> PendingReason | None:
        reason = self._reason(shape)
        if reason is None or not self.cordoned or reason.code is reasons.ReasonCode.NO_NODES_ONLINE:
            return reason  # (with no node schedulable, that reason already counts the cordoned ones)
        if self._with_cordoned is None:
            self._with_cordoned = InventoryCheck(self.capacity, self.placer, nodes=[*self.schedulable, *self.cordoned])
        if self._with_cordoned._reason(shape) is not None:
            return reason
        # Name only the cordoned nodes with GPUs this request can use (model, memory).
        pools = set(self.placer.pools_for(shape))
        able = sorted(n.name for n in self.cordoned if any(g.pool in pools for g in n.gpus))
        return reasons.needs_cordoned_nodes(able, reason)

    def _node_widths(self, pools: list[int]) -> list[int]:
        """Usable GPUs per schedulable node for these pools, widest first."""
        key = tuple(pools)
        if key not in self._widths:
            self._widths[key] = sorted((sum(1 for g in n.gpus if g.pool in pools) for n in self.schedulable),
                                       reverse=True)
        return self._widths[key]

    def _reason(self, shape: Shape) -> PendingReason | None:
        reason = self._gpu_reason(shape)
        if reason is None and shape.needs_host:
            return self._host_reason(shape)
        return reason

    def _host_reason(self, shape: Shape) -> PendingReason | None:
        """The GPUs exist: can the nodes that have them feed the request (whole CPU and memory)?"""
        def fed(cpu: int, memory: int) -> bool:
            for model_pools in self.placer.pools_by_model(self.placer.pools_for(shape)):
                per_node = sorted((min(sum(1 for g in n.gpus if g.pool in model_pools),
                                       host_resources.gpus_ever_allowed(n, cpu, memory)) for n in self.schedulable),
                                  reverse=True)
                if sum(per_node[: shape.max_nodes] if shape.max_nodes is not None else per_node) >= shape.gpus:
                    return True
            return False

        if fed(shape.cpu_per_gpu, shape.host_mb_per_gpu):
            return None
        resource = "cpu" if not fed(shape.cpu_per_gpu, 0) else "memory"
        totals = [n.cpu_total if resource == "cpu" else n.host_total_mb for n in self.schedulable]
        per_gpu = shape.cpu_per_gpu if resource == "cpu" else shape.host_mb_per_gpu
        return reasons.no_node_with_enough_host(resource, per_gpu * shape.gpus,
                                                max((t for t in totals if t is not None), default=None))

    def _gpu_reason(self, shape: Shape) -> PendingReason | None:
        if not self.schedulable:
            cordoned = sum(1 for n in self.capacity.nodes if not n.schedulable)
            return reasons.no_nodes_online(len(self.capacity.nodes), cordoned)
        if shape.models and not shape.models.intersection(self.online_models):
            return reasons.model_unavailable(shape.models, self.online_models)
        if shape.needs_runtime:
            # What stops it anywhere comes first; the runtime is named only when it is what is missing.
            return self._reason(self._without_runtime(shape)) or self._runtime_reason(shape)
        pools = self.placer.pools_for(shape)
        # (``pools`` spans every node: ones that exist only on cordoned or offline nodes fit nothing here.)
        if not pools or (shape.gpus == 1 and not self._node_widths(pools)[0]):
            largest = max(mib for model, mib in self.largest_mib.items() if not shape.models or model in shape.models)
            return reasons.no_gpu_with_memory(shape.memory_mib or 0, largest, shape.models)
        if shape.gpus == 1:
            return None
        # A gang takes GPUs of one model (see Placer._gang): it fits if one model's GPUs do.
        widest = total = 0
        for model_pools in self.placer.pools_by_model(pools):
            per_node = self._node_widths(model_pools)
            within = sum(per_node[: shape.max_nodes]) if shape.max_nodes is not None else sum(per_node)
            if within >= shape.gpus:
                return None
            widest, total = max(widest, per_node[0] if per_node else 0), max(total, sum(per_node))
        if shape.max_nodes is not None:
            return reasons.gang_larger_than_any_node(shape.gpus, widest, shape.max_nodes)
        return reasons.gang_larger_than_cluster(shape.gpus, total)

    def _without_runtime(self, shape: Shape) -> Shape:
        plain = self._plain.get(shape)
        if plain is None:
            plain = self._plain[shape] = replace(shape, needs_runtime=False)
        return plain

    def _runtime_reason(self, shape: Shape) -> PendingReason | None:
        """The request fits the inventory: does it fit the nodes with a container runtime?"""
        for model_pools in self.placer.pools_by_model(self.placer.pools_for(shape)):
            per_node = self._node_widths(model_pools)
            within = sum(per_node[: shape.max_nodes]) if shape.max_nodes is not None else sum(per_node)
            if within >= shape.gpus:
                return None
        return reasons.needs_container_runtime(self.runtime_nodes, shape.gpus)
