"""The dead-letter stream: where a reader puts an entry it cannot apply, with the reason.

Readers never crash on garbage and never half-apply it: they dead-letter, count, and ack.
"""

from __future__ import annotations

import logging

import redis

from agents import protocol

log = logging.getLogger(__name__)

RAW_BYTES_KEPT = 1024


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
