"""Fixtures shared by every test: a private Redis per test session, flushed per test."""

from __future__ import annotations

import pytest
import redis as redis_lib

from cluster_ui.devstack.redis_server import PrivateRedis


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Throttle counters live in the cache: no test inherits another's."""
    try:
        from django.core.cache import cache

        cache.clear()
    except Exception:  # Django not configured (agent-only runs with -p no:django)
        pass


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url):
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def live_redis(redis_url, settings):
    """Point Django services and the Celery producer at the private Redis for this test."""
    from cluster_ui.celery import app as celery_app

    settings.REDIS_URL = redis_url
    previous = celery_app.conf.broker_url
    celery_app.conf.broker_url = redis_url
    yield redis_url
    celery_app.conf.broker_url = previous

