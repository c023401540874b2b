"""Node liveness from the agents' heartbeat keys (a key with a TTL per node)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from agents.protocol import heartbeat_key
from monitoring.choices import NodeState
from monitoring.models import Node



def _registration_grace() -> timedelta:
    # A node that registered this recently is not judged yet (its first heartbeat may be in flight).
    return timedelta(seconds=settings.COLONY_NODE_REGISTRATION_GRACE_S)


def live_node_names(client: redis.Redis, names: Iterable[str]) -> set[str]:
    """The subset of ``names`` whose agent heartbeat has not expired (one round trip)."""
    names = list(names)
    if not names:
        return set()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(heartbeat_key(name))
    return {name for name, alive in zip(names, pipe.execute()) if alive}


def silent_nodes(client: redis.Redis) -> list[Node]:
    """UP nodes whose heartbeat expired: candidates to be marked LOST."""
    candidates = list(Node.objects.filter(state=NodeState.UP, registered_at__lt=timezone.now() - _registration_grace()))
    alive = live_node_names(client, [node.name for node in candidates])
    return [node for node in candidates if node.name not in alive]


def mark_lost(node: Node) -> bool:
    """UP -> LOST; False if someone else already did (so the caller requeues only once)."""
    return bool(Node.objects.filter(pk=node.pk, state=NodeState.UP).update(
        state=NodeState.LOST, state_changed_at=timezone.now()
    ))


def revive_heartbeating(client: redis.Redis) -> list[str]:
    """LOST nodes heartbeating again (a hung agent recovered without re-registering) -> UP."""
    lost = list(Node.objects.filter(state=NodeState.LOST).values_list("name", flat=True))
    back = sorted(live_node_names(client, lost))
    if back:
        Node.objects.filter(name__in=back, state=NodeState.LOST).update(state=NodeState.UP,
                                                                         state_changed_at=timezone.now())
    return back
