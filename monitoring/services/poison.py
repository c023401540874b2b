"""Poison tolerance for the stream readers (metrics ingest, agent events).

A stream entry can fail to apply for two kinds of reasons, and a reader must tell them apart:

- an **outage** (:func:`is_outage`: the database went away, or Redis failed us: gone, out of
  memory, read-only after a failover). Nothing is wrong with the entries; the reader keeps them
  unacknowledged and applies them once the service is back. An outage never dead-letters anything.
- anything else (``IntegrityError``, ``DataError``, ``ValueError``, ``OverflowError``, a bug that
  one entry's content trips): the **data**. Such an entry is *poison*: it is tried again a
  bounded number of times (:data:`MAX_TRIES`; a race that made it fail once does not lose it),
  then dead-lettered with its reason and acknowledged. It never blocks the entries behind it, and
  a reader never exits because of it.

Tries are counted per entry in Redis (with a TTL), so they add up across calls, readers and
restarts. :func:`apply_isolating` finds the poison inside a batch that is applied all or nothing
(ingest): it applies the halves of a failed batch, down to single entries.

This module must not import ``jobs`` (imports flow cluster_ui -> jobs -> monitoring -> agents).
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

import redis
from django.db import InterfaceError, OperationalError

from agents.streams import dead_letter

log = logging.getLogger(__name__)

# What a service that went away (or refuses everyone) raises. Everything else a reader meets while
# applying an entry is blamed on the entry. No Redis error is the data's fault: keys and stream
# names come from validated messages, and retrying a Redis failure after the database committed
# would apply the entry twice.
OUTAGES = (OperationalError, InterfaceError, redis.RedisError)
# Tries of one entry before it is dead-lettered.
MAX_TRIES = 3
# How long a count of failed tries is kept (entry ids are never reused, so this only bounds memory).
TRIES_TTL_S = 24 * 3600
REASON_CHARS = 300

Item = TypeVar("Item")


def is_outage(exc: BaseException) -> bool:
    return isinstance(exc, OUTAGES)


def reason_of(exc: BaseException) -> str:
    """One line naming the error, for the dead-letter stream and the log."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:REASON_CHARS] if text else type(exc).__name__


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PoisonCounter:
    """Counts failed tries of the entries of one stream read by one consumer group, and
    dead-letters (and acknowledges) an entry once it has failed :data:`MAX_TRIES` times."""

    def __init__(self, client: redis.Redis, stream: str, group: str, max_tries: int = MAX_TRIES):
        self.client = client
        self.stream = stream
        self.group = group
        self.max_tries = max_tries

    def _key(self, entry_id) -> str:
        return f"colony:poison:{self.stream}:{self.group}:{_text(entry_id)}"

    def failed(self, entry_id, fields: dict | None, exc: BaseException) -> bool:
        """Count one failed try; returns True when the entry may be tried again, False when it was
        dead-lettered and acknowledged just now."""
        key = self._key(entry_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, TRIES_TTL_S)
        tries = int(pipe.execute()[0])
        reason = reason_of(exc)
        if tries < self.max_tries:
            log.warning("%s entry %s failed to apply (try %d of %d): %s",
                        self.stream, _text(entry_id), tries, self.max_tries, reason)
            return True
        dead_letter(self.client, self.stream, entry_id, fields, f"failed to apply {tries} times: {reason}")
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.delete(key)
        pipe.execute()
        return False

    def forget(self, entry_id) -> None:
        """An entry that failed before has now been applied: drop its count."""
        self.client.delete(self._key(entry_id))

    def apply(self, entry_id, fields: dict | None, attempt: Callable[[], object]) -> tuple[bool, object]:
        """Call ``attempt`` (which applies the entry all or nothing) until it succeeds or the entry
        is dead-lettered. Returns ``(applied, what attempt returned)``. Outages propagate: the
        entry stays unacknowledged for when the service is back."""
        failed_before = False
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if is_outage(exc):
                    raise
                failed_before = True
                if not self.failed(entry_id, fields, exc):
                    return False, None
                continue
            if failed_before:
                self.forget(entry_id)
            return True, result


def apply_isolating(items: Sequence[Item], apply: Callable[[Sequence[Item]], None],
                    poisoned: Callable[[Item, BaseException], bool]) -> None:
    """Apply ``items`` with ``apply`` (all or nothing); when that fails on data, apply each half
    the same way, down to single items. For a single item that fails, ``poisoned(item, error)``
    says whether to try it again (True) or give it up (False: it has been dead-lettered).

    One poison entry in a batch of n costs about 2·log2(n) extra applies; the rest of the batch
    is applied. Outages propagate at once, with nothing of the failed part applied."""
    if not items:
        return
    try:
        apply(items)
        return
    except Exception as exc:
        if is_outage(exc):
            raise
        error = exc
    if len(items) > 1:
        middle = len(items) // 2
        apply_isolating(items[:middle], apply, poisoned)
        apply_isolating(items[middle:], apply, poisoned)
        return
    while poisoned(items[0], error):
        try:
            apply(items)
            return
        except Exception as exc:
            if is_outage(exc):
                raise
            error = exc


def parse_or_dead_letter(client: redis.Redis, source: str, entry_id, fields: dict, decode,
                         auth_required: bool):
    """The entry as a protocol message signed by the node it names, or None once it has been
    dead-lettered with the reason (the caller acks it). An outage propagates: nothing is lost."""
    from agents import protocol
    from monitoring.services.registry import authenticate  # registry reads models; keep this import late

    try:
        message = decode(fields)
        authenticate(fields, message, auth_required)
    except Exception as exc:
        if is_outage(exc):
            raise
        dead_letter(client, source, entry_id, fields,
                    str(exc) if isinstance(exc, protocol.ProtocolError) else reason_of(exc))
        return None
    return message
