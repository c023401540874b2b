"""Fixtures shared by every test: a private Redis per test session (flushed per test), and the
people of every permission test (healthchecks' alice/bob/charlie): alice owns the jobs, bob is her
teammate in ``vision``, charlie an outsider in ``nlp``; ``operator`` is staff. ``api(user)`` and
``web(user)`` are an API client and Django's test client signed in as ``user``; ``cluster`` two
nodes of GPUs."""

from __future__ import annotations

import os

import pytest
import redis as redis_lib
from hypothesis import settings

from cluster_ui.devstack.redis_server import PrivateRedis

# On CI the property tests draw the same examples every run: a submission lands or not on what it
# changed, not on the one random draw in thousands that finds an old corner (run them locally, or
# with HYPOTHESIS_PROFILE=explore, to search further). Loaded here, before any test module builds
# its settings from the default.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore"))


def pytest_ignore_collect(collection_path, config):
    """With ``-m e2e`` alone (``make test``'s second pass), a test module whose source never says
    ``e2e`` is not imported: it can hold no e2e test (the marker is set in the module, as
    ``pytestmark`` or a decorator), and collecting the whole tree to deselect all but 24 tests took
    about 8 s, half of it schemathesis drawing the API fuzz's cases."""
    if config.getoption("markexpr", "").strip() != "e2e" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None  # conftest.py, helpers: collected as usual
    try:
        return b"e2e" not in collection_path.read_bytes() or None
    except OSError:
        return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run first, the order being otherwise kept: on two xdist workers, one
    that started late made the other wait for it at the end of the pass. Not a transactional one:
    pytest-django runs those after the rest, as their flush would empty what migrations put in."""

    def late(item) -> bool:
        return item.get_closest_marker("slow") is None or bool(
            {"transactional_db", "live_server"} & set(getattr(item, "fixturenames", ())))

    items.sort(key=late)


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



# -- people and tenants --------------------------------------------------------------------------


@pytest.fixture
def vision(db):
    from tests.factories import TenantFactory

    return TenantFactory(slug="vision")


@pytest.fixture
def nlp(db):
    from tests.factories import TenantFactory

    return TenantFactory(slug="nlp", guaranteed_gpus=2, max_gpus=6)


@pytest.fixture
def alice(vision):
    from tests.factories import MembershipFactory, UserFactory

    return MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user


@pytest.fixture
def bob(vision):
    from tests.factories import MembershipFactory, UserFactory

    return MembershipFactory(user=UserFactory(username="bob"), tenant=vision).user


@pytest.fixture
def charlie(nlp):
    from tests.factories import MembershipFactory, UserFactory

    return MembershipFactory(user=UserFactory(username="charlie"), tenant=nlp).user


@pytest.fixture
def operator(db):
    from tests.factories import UserFactory

    return UserFactory(username="operator", is_staff=True, is_superuser=True)


@pytest.fixture
def api():
    from rest_framework.test import APIClient

    def client_for(user=None):
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return client_for


@pytest.fixture
def web(client):
    """Django's test client, logged in as the given user."""

    def client_for(user):
        client.force_login(user)
        return client

    return client_for


@pytest.fixture
def cluster(db):
    """Two nodes: ``a1`` (rack r1) with 4 x A100-80GB, ``v1`` (rack r2) with 2 x V100-32GB."""
    from tests.factories import GpuFactory, NodeFactory

    a1, v1 = NodeFactory(name="a1", rack="r1"), NodeFactory(name="v1", rack="r2")
    gpus = {f"a1/{i}": GpuFactory(node=a1, index=i, uuid=f"GPU-a1-{i}") for i in range(4)}
    gpus |= {f"v1/{i}": GpuFactory(node=v1, index=i, uuid=f"GPU-v1-{i}", model="V100-32GB", memory_mib=32768)
             for i in range(2)}
    return gpus
