"""Node registrations from agents -> Node and Gpu rows."""

from __future__ import annotations

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


def largest_placement() -> tuple[int, int]:
    """(most GPUs on one node, most memory on one GPU in MiB) over the present inventory.

    Both are 0 while no node has registered. Submission uses these to reject requests that could
    never run anywhere.
    """
    present = Gpu.objects.filter(present=True)
    per_node = present.values("node").annotate(n=Count("id")).aggregate(m=Max("n"))["m"]
    memory = present.aggregate(m=Max("memory_mib"))["m"]
    return per_node or 0, memory or 0
