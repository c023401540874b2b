"""Where a gang's GPUs sit: the ring all-reduce cost model, the choice of nodes for a gang that
spans several, and the torchrun rendezvous of the result.

Preference, in order: one node; then the fewest nodes; then one rack; then the cheapest ring
all-reduce; then the least left over (best fit). The cost of a ring all-reduce of B bytes over N
ranks is 2(N-1)/N x B / (bandwidth of the slowest link in the ring).
"""

from __future__ import annotations

from operator import attrgetter

from jobs.scheduling.capacity import GpuSlot, NodeSlot
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import NodeSlice, Rendezvous

Candidate = tuple[NodeSlot, list[GpuSlot]]
_by_index, _by_id, _gpu_ids = attrgetter("index"), attrgetter("id"), attrgetter("gpu_ids")


def allreduce_seconds(gpus: int, allreduce_bytes: int, gb_per_s: float) -> float:
    if gpus <= 1:
        return 0.0
    return 2 * (gpus - 1) / gpus * allreduce_bytes / (gb_per_s * 1e9)


def slowest_link(nodes: list[NodeSlot], config: SchedulerConfig) -> float:
    slowest = min(node.gb_per_s for node in nodes)
    if len(nodes) > 1:
        racks = {node.rack for node in nodes}
        slowest = min(slowest, config.inter_rack_gb_per_s if len(racks) > 1 else config.inter_node_gb_per_s)
    return slowest


def _fewest_nodes(candidates: list[Candidate], gpus: int) -> list[Candidate] | None:
    """Largest nodes first (that minimises the count), then the tightest node for the remainder."""
    ordered = sorted(candidates, key=lambda c: (-len(c[1]), c[0].key))
    chosen: list[Candidate] = []
    total = 0
    for position, candidate in enumerate(ordered):
        if total + len(candidate[1]) >= gpus:
            remainder = gpus - total
            last = min((c for c in ordered[position:] if len(c[1]) >= remainder),
                       key=lambda c: (len(c[1]), c[0].key))
            return chosen + [(last[0], last[1][:remainder])]
        chosen.append(candidate)
        total += len(candidate[1])
    return None


def choose_nodes(candidates: list[Candidate], gpus: int, allreduce_bytes: int,
                 config: SchedulerConfig) -> list[Candidate] | None:
    """Pick GPUs for a gang spanning nodes; ``candidates`` are nodes with their usable free GPUs."""
    options: list[list[Candidate]] = []
    by_rack: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_rack.setdefault(candidate[0].rack, []).append(candidate)
    for rack in sorted(by_rack):
        if sum(len(c[1]) for c in by_rack[rack]) >= gpus and (choice := _fewest_nodes(by_rack[rack], gpus)):
            options.append(choice)
    if len(by_rack) > 1 and (choice := _fewest_nodes(candidates, gpus)):
        options.append(choice)
    if not options:
        return None

    def preference(choice: list[Candidate]):
        nodes = [c[0] for c in choice]
        cost = allreduce_seconds(gpus, allreduce_bytes, slowest_link(nodes, config))
        left_over = sum(len(c[1]) for c in candidates if c[0] in nodes) - gpus
        return (len(nodes), len({n.rack for n in nodes}), cost, left_over, [n.key for n in nodes])

    return min(options, key=preference)


def slices_of(choice: list[Candidate]) -> tuple[NodeSlice, ...]:
    """Node ranks follow the choice (largest share first), ranks are contiguous per node."""
    slices = []
    first_rank = 0
    for node_rank, (node, gpus) in enumerate(choice):
        gpus = sorted(gpus, key=_by_index)
        slices.append(NodeSlice(node=node.name, gpu_ids=tuple(map(_by_id, gpus)),
                                gpu_indices=tuple(map(_by_index, gpus)), node_rank=node_rank, first_rank=first_rank))
        first_rank += len(gpus)
    return tuple(slices)


def rendezvous_of(job_id: int, slices: tuple[NodeSlice, ...], config: SchedulerConfig) -> Rendezvous | None:
    world_size = sum(map(len, map(_gpu_ids, slices)))
    if world_size < 2:
        return None
    return Rendezvous(master_node=slices[0].node,
                      master_port=config.rendezvous_port_base + job_id % config.rendezvous_port_span,
                      world_size=world_size, nnodes=len(slices))
