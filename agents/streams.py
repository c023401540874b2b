"""Redis stream plumbing, once, for both ends: consumer groups (create, read, claim what a dead
reader left), and the dead-letter stream where a reader puts what it cannot apply, with the reason.

Django-free: the node agent reads its command stream through it and the control plane its event,
metric and log streams. Works on Redis 6.2 and 7 (their XAUTOCLAIM replies differ). Readers never
crash on garbage and never half-apply it: they dead-letter, count, and ack.
"""

from __future__ import annotations

import logging
import os
import socket

import redis

from agents import protocol

log = logging.getLogger(__name__)

# Of an entry that could not be read, this much of its raw message is kept in the dead letter.
RAW_BYTES_KEPT = 1024


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def ensure_group(client: redis.Redis, stream: str, group: str) -> None:
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def claim_stale(client: redis.Redis, stream: str, group: str, consumer: str, min_idle_ms: int,
                count: int = 1000) -> list:
    """Entries another reader took and never acked (it died): ours now."""
    claimed: list = []
    cursor = "0-0"
    while True:
        # Redis 7 also returns the ids of entries deleted meanwhile; 6.2 returns two items.
        reply = client.xautoclaim(stream, group, consumer, min_idle_ms, cursor, count=count)
        cursor, entries = reply[0], reply[1]
        claimed.extend(entries)
        if cursor in (b"0-0", "0-0") or not entries:
            return claimed


def read_new(client: redis.Redis, stream: str, group: str, consumer: str, count: int,
             block_ms: int | None = None) -> list:
    response = client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms)
    return response[0][1] if response else []


def read_pending(client: redis.Redis, stream: str, group: str, consumer: str, count: int) -> list:
    """Entries handed to ``consumer`` before and never acked (it restarted, or lost its
    connection), oldest first; they come back at once, without blocking."""
    response = client.xreadgroup(group, consumer, {stream: "0"}, count=count)
    return response[0][1] if response else []


def drain(client: redis.Redis, stream: str, group: str, handle, *, batch: int, max_batches: int,
          claim_idle_ms: int) -> int:
    """Hand ``handle(client, entries)`` what a dead reader left pending, then up to
    ``max_batches`` batches of new entries; returns how many entries were handled."""
    consumer = consumer_name()
    ensure_group(client, stream, group)
    handled = handle(client, claim_stale(client, stream, group, consumer, claim_idle_ms))
    for _ in range(max_batches):
        entries = read_new(client, stream, group, consumer, batch)
        if not entries:
            break
        handled += handle(client, entries)
    return handled


def dead_letter(client: redis.Redis, source: str, entry_id, fields: dict | None, reason: str) -> None:
    raw = (fields or {}).get(b"m", (fields or {}).get("m", b""))
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    log.warning("dead-lettered %s entry %s: %s", source, entry_id, reason)
    pipe = client.pipeline()
    pipe.xadd(
        protocol.DEAD_LETTER_STREAM,
        {"source": source, "id": entry_id, "reason": reason[:500], "raw": raw[:RAW_BYTES_KEPT]},
        maxlen=10_000, approximate=True,
    )
    pipe.incr(protocol.DEAD_LETTER_COUNT_KEY)
    pipe.execute()


def dead_letter_count(client: redis.Redis) -> int:
    return int(client.get(protocol.DEAD_LETTER_COUNT_KEY) or 0)
