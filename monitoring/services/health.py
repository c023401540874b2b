"""Node liveness from the agents' heartbeat keys (a key with a TTL per node)."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from agents.protocol import heartbeat_key


def live_node_names(client: redis.Redis, names: Iterable[str]) -> set[str]:
    """The subset of ``names`` whose agent heartbeat has not expired (one round trip)."""
    names = list(names)
    if not names:
        return set()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(heartbeat_key(name))
    return {name for name, alive in zip(names, pipe.execute()) if alive}
