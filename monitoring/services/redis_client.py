"""The process-wide connection to the cluster's Redis (agents' streams, heartbeats, locks)."""

from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)


def get_redis() -> redis.Redis:
    # Keyed by URL so that tests overriding settings.REDIS_URL get their own client.
    return _client(settings.REDIS_URL)
