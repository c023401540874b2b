"""Node liveness from the agents' heartbeat keys (a key with a TTL per node).

A node whose heartbeat expired is first only *suspected* (:data:`SUSPECTED_KEY` says since when);
it is lost once it has stayed silent for ``COLONY_NODE_LOST_GRACE_S`` more. A heartbeat that
lapses for a few seconds on a loaded machine must not requeue jobs that still run there, or have
just finished: they would run twice.

The keys live in Redis, which keeps nothing on disk: after it restarts, every heartbeat is gone
at once and the agents need a moment to reconnect. Silence then says nothing about the nodes, so
nobody is judged until ``COLONY_REDIS_RESTART_GRACE_S`` after this Redis was first seen (a key
of our own that the restart took with it). Otherwise every job would be requeued, and run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.utils import timezone

from agents.protocol import heartbeat_key
from monitoring.choices import NodeHealth
from monitoring.models import Node
from monitoring.services.registry import inventory_changed

log = logging.getLogger(__name__)

REDIS_SEEN_SINCE_KEY = "colony:redis:seen_since"
# Hash: node name -> when the control plane first found its heartbeat expired (unix seconds), for
# the UP nodes silent now. Lost with Redis, which only makes the grace start again.
SUSPECTED_KEY = "colony:nodes:suspected"
# A heartbeat key set to outlive this is not a heartbeat: a node (or a job holding its Redis
# password) that sets one for ten years must not keep a dead node UP and its jobs unrequeued.
# Agents use a TTL of a few intervals (10 s by default).
MAX_HEARTBEAT_TTL_S = 120


def _registration_grace() -> timedelta:
    # A node that registered this recently is not judged yet (its first heartbeat may be in flight).
    return timedelta(seconds=settings.COLONY_NODE_REGISTRATION_GRACE_S)


# The PTTL of each key, judged inside Redis: one command for a thousand nodes, and only the live
# ones' positions (1-based) come back. A pipeline of a PTTL per node cost the scheduling loop and
# node health about a millisecond per hundred nodes in client-side packing and parsing alone.
# With ARGV[2] "silent", the positions of the others: most nodes are live, and parsing a
# thousand positions back was most of node health's client-side cost.
_LIVE_SCRIPT = """
local found, longest, silent = {}, tonumber(ARGV[1]), ARGV[2] == 'silent'
for i, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if (ttl > 0 and ttl <= longest) ~= silent then found[#found + 1] = i end
end
return found
"""


def live_node_names(client: redis.Redis, names: Iterable[str]) -> set[str]:
    """The subset of ``names`` whose agent heartbeat has not expired (one round trip). A key with
    no expiry, or one longer than :data:`MAX_HEARTBEAT_TTL_S`, does not count."""
    names = list(names)
    if not names:
        return set()
    return {names[position - 1] for position in _liveness(client, names, "live")}


def silent_node_names(client: redis.Redis, names: list[str]) -> list[str]:
    """Those of ``names`` that :func:`live_node_names` would leave out, in their order."""
    return [names[position - 1] for position in _liveness(client, names, "silent")] if names else []


def _liveness(client: redis.Redis, names: list[str], which: str) -> list[int]:
    # EVAL, not EVALSHA: always one round trip, even on a Redis that restarted without the script.
    return client.eval(_LIVE_SCRIPT, len(names), *map(heartbeat_key, names), MAX_HEARTBEAT_TTL_S * 1000, which)


def redis_seen_for(client: redis.Redis) -> float:
    """Seconds since the control plane first saw this Redis (since it last restarted empty)."""
    now = time.time()
    client.set(REDIS_SEEN_SINCE_KEY, now, nx=True)
    return now - float(client.get(REDIS_SEEN_SINCE_KEY) or now)


def up_nodes() -> list[tuple[str, datetime]]:
    """(name, registered_at) of the UP nodes: what :func:`silent_nodes` judges."""
    return list(Node.objects.filter(state=NodeHealth.UP).values_list("name", "registered_at"))


def silent_nodes(client: redis.Redis, up: list[tuple[str, datetime]] | None = None) -> list[Node]:
    """UP nodes whose heartbeat expired at least ``COLONY_NODE_LOST_GRACE_S`` ago, as far as
    this control plane saw: to be marked LOST. Those silent for less are suspected (and logged
    once); one heard again is no longer. None while Redis is new. ``up``: :func:`up_nodes` as the
    caller holds it (it knows they did not change), else read now."""
    if redis_seen_for(client) < settings.COLONY_REDIS_RESTART_GRACE_S:
        return []
    # Names only: a thousand Node rows built every two seconds to find none silent cost more than
    # the rest of the check.
    registered_before = timezone.now() - _registration_grace()
    candidates = [name for name, registered_at in (up_nodes() if up is None else up)
                  if registered_at < registered_before]
    silent = silent_node_names(client, candidates)
    past_grace = _silent_past_grace(client, silent)
    if not past_grace:
        return []
    nodes = Node.objects.in_bulk(past_grace, field_name="name")
    return [nodes[name] for name in silent if name in past_grace and name in nodes]


def _silent_past_grace(client: redis.Redis, silent: list[str]) -> set[str]:
    """Keep :data:`SUSPECTED_KEY` to exactly the nodes in ``silent`` (each with when it was first
    found so) and return those silent for the whole grace. One round trip, two when one is cleared."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.hkeys(SUSPECTED_KEY)
    for name in silent:
        pipe.hsetnx(SUSPECTED_KEY, name, repr(now))
    if silent:
        pipe.hmget(SUSPECTED_KEY, silent)
    replies = pipe.execute()
    # Heard again, lost, or gone: suspected no more.
    cleared = {key.decode() if isinstance(key, bytes) else key for key in replies[0]} - set(silent)
    if cleared:
        client.hdel(SUSPECTED_KEY, *cleared)
    if not silent:
        return set()
    for name, new in zip(silent, replies[1:-1]):
        if new:
            log.warning("node %s: heartbeat expired; suspected, lost if still silent in %.0f s", name,
                        settings.COLONY_NODE_LOST_GRACE_S)
    since = {name: float(value) for name, value in zip(silent, replies[-1]) if value is not None}
    return {name for name in silent if now - since.get(name, now) >= settings.COLONY_NODE_LOST_GRACE_S}


def mark_lost(node: Node) -> bool:
    """UP -> LOST; False if someone else already did (so the caller requeues only once)."""
    lost = bool(Node.objects.filter(pk=node.pk, state=NodeHealth.UP).update(
        state=NodeHealth.LOST, state_changed_at=timezone.now()
    ))
    if lost:
        inventory_changed()  # its GPUs no longer count at submission
    return lost


def revive_heartbeating(client: redis.Redis, samples: dict[str, dict],
                        held: Callable[[list[str]], dict[str, set[int]]]) -> list[str]:
    """LOST nodes heartbeating again (a hung agent recovered without re-registering) -> UP, once a
    sample taken since the loss (``samples``: node -> its latest, as ``live.latest_nodes``) shows
    it running no job but those it holds (``held(names)``: node -> ids of jobs allocated there).
    Its jobs were requeued and its GPUs released when it was lost; a process still running there,
    its stop on its way, would share the GPUs the scheduler hands out the moment the node is UP."""
    lost = dict(Node.objects.filter(state=NodeHealth.LOST).values_list("name", "state_changed_at"))
    heard = sorted(live_node_names(client, lost))
    holding = held(heard) if heard else {}
    back = []
    for name in heard:
        sample, since = samples.get(name), lost[name].timestamp() if lost[name] else 0.0
        if sample is None or sample["ts"] < since:
            continue  # not sampled since it was lost: what still runs there is unknown
        strays = set(sample.get("running_jobs") or ()) - holding.get(name, set())
        if strays:
            log.info("node %s heartbeats again but still runs jobs %s it no longer holds; UP once stopped",
                     name, sorted(strays))
            continue
        back.append(name)
    if back:
        Node.objects.filter(name__in=back, state=NodeHealth.LOST).update(state=NodeHealth.UP,
                                                                         state_changed_at=timezone.now())
        inventory_changed()  # submissions that need its GPUs are accepted again at once
    return back
