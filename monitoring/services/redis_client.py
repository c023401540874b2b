"""The process-wide connection to the cluster's Redis (agents' streams, heartbeats, locks)."""

import logging
import math
from functools import lru_cache

import redis
from django.conf import settings

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)


def get_redis() -> redis.Redis:
    # Keyed by URL so that tests overriding settings.REDIS_URL get their own client.
    return _client(settings.REDIS_URL)


def number(value) -> float | None:
    """A counter or timestamp read back from Redis as a finite float, or None for anything else
    (a field another writer garbled must cost one series, not the whole of /metrics)."""
    try:
        parsed = float(value)
    except (TypeError, ValueError):
        return None
    return parsed if math.isfinite(parsed) else None


def numbers(client: redis.Redis, key: str) -> dict[str, float]:
    """The fields of a Redis hash of counters, as floats; a field that is not a finite number is
    left out and logged."""
    found = {}
    for field, value in client.hgetall(key).items():
        name = field.decode(errors="replace")
        parsed = number(value)
        if parsed is None:
            log.warning("Redis hash %s: field %r holds %r, not a number; left out", key, name, value[:40])
        else:
            found[name] = parsed
    return found
