"""Node registrations from agents -> Node and Gpu rows."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from agents.protocol import NodeRegistered
from monitoring.choices import NodeState
from monitoring.models import Gpu, Node


@transaction.atomic
def register_node(message: NodeRegistered) -> Node:
    """Create or refresh a node and its GPUs; GPUs no longer reported are marked absent.

    Absent GPUs are kept rather than deleted because allocations of finished jobs point at them.
    """
    now = timezone.now()
    node, _ = Node.objects.update_or_create(
        name=message.node,
        defaults={
            "hostname": message.hostname,
            "backend": message.backend,
            "agent_version": message.agent_version,
            "topology": [link.model_dump() for link in message.topology],
            "registered_at": now,
        },
    )
    if node.state != NodeState.UP:
        Node.objects.filter(pk=node.pk).update(state=NodeState.UP, state_changed_at=now)
        node.refresh_from_db()
    reported = {gpu.uuid: gpu for gpu in message.gpus}
    Gpu.objects.filter(node=node).exclude(uuid__in=reported).update(present=False)
    for uuid, info in reported.items():
        Gpu.objects.update_or_create(
            uuid=uuid,
            defaults={"node": node, "index": info.index, "model": info.model,
                      "memory_mib": info.memory_mib, "present": True},
        )
    return node


@dataclass(frozen=True)
class Inventory:
    """What the present inventory can offer, for rejecting requests that could never run.

    All zero/empty while no node has registered (then nothing is rejected on size).
    """

    gpus_per_node: tuple[int, ...]  # descending
    largest_gpu_mib: int
    models: frozenset[str]

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)

    @property
    def most_gpus_on_a_node(self) -> int:
        return self.gpus_per_node[0] if self.gpus_per_node else 0

    def widest_nodes(self, nodes: int) -> int:
        """Most GPUs that ``nodes`` nodes hold together."""
        return sum(self.gpus_per_node[:nodes])


def cluster_inventory() -> Inventory:
    present = Gpu.objects.filter(present=True)
    per_node = sorted(present.values("node").annotate(n=Count("id")).values_list("n", flat=True), reverse=True)
    memory = present.aggregate(m=Max("memory_mib"))["m"] or 0
    models = frozenset(present.values_list("model", flat=True).distinct())
    return Inventory(gpus_per_node=tuple(per_node), largest_gpu_mib=memory, models=models)
