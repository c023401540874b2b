"""The inventory that submissions are checked against is read once per change, not per submission:
each process keeps it under a version in Redis that every writer of the inventory bumps. A node
registering, being marked lost, or GPUs changing is seen by the very next submission.

These tests run outside a test transaction (``transactional_db``): inside one the inventory is never
kept (a rollback could take back what was read), which would make them pass for the wrong reason.
"""

import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.protocol import GpuInfo, NodeRegistered, heartbeat_key
from jobs.models import Job
from jobs.services import node_health
from monitoring.choices import NodeHealth
from monitoring.models import Gpu, Node
from monitoring.services import health, registry
from tests.factories import MembershipFactory, TenantFactory, UserFactory

URL = "/api/v1/jobs/"
GANG = {"command": ["python", "train.py"], "gpus": 8, "max_nodes": 1}


def registration(node: str, gpus: int, model="A100-80GB", memory=81920) -> NodeRegistered:
    return NodeRegistered(node=node, backend="simulated", agent_version="0.1.0", hostname=node,
                          gpus=[GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model=model, memory_mib=memory)
                                for i in range(gpus)])


@pytest.fixture
def submitter(transactional_db, live_redis, api):
    user = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    return api(user)


def refused(response) -> None:
    assert response.status_code == 400, response.content
    assert "8 can never be granted" in response.json()["error"]["fields"]["gpus"][0]


def test_the_inventory_is_read_once_until_it_changes(transactional_db, live_redis):
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert registry.cluster_inventory().total_gpus == 4
    assert len(queries) == 0


def test_a_node_registering_is_seen_by_the_next_submission(submitter):
    registry.register_node(registration("small", 4))
    refused(submitter.post(URL, GANG, format="json"))
    registry.register_node(registration("big", 8))
    assert submitter.post(URL, GANG, format="json").status_code == 201


def test_gpus_a_node_no_longer_reports_stop_counting_at_once(submitter):
    registry.register_node(registration("big", 8))
    assert submitter.post(URL, GANG, format="json").status_code == 201
    registry.register_node(registration("big", 6))  # two GPUs gone (marked absent)
    refused(submitter.post(URL, GANG, format="json"))


def test_a_node_marked_lost_stops_counting_at_once(submitter):
    registry.register_node(registration("big", 8))
    registry.register_node(registration("small", 4))
    assert submitter.post(URL, GANG, format="json").status_code == 201
    big = Node.objects.get(name="big")
    assert node_health.requeue_lost_node(big)
    refused(submitter.post(URL, GANG, format="json"))
    # Registering again brings it back, at once.
    registry.register_node(registration("big", 8))
    assert submitter.post(URL, GANG, format="json").status_code == 201


def test_saves_and_deletes_of_nodes_and_gpus_count_as_changes(submitter):
    """The admin and fixtures write rows one by one: their signals say it."""
    registry.register_node(registration("small", 4))
    assert submitter.post(URL, GANG, format="json").status_code == 400
    node = Node.objects.create(name="added", registered_at=timezone.now())
    for i in range(8):
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-added-{i}", model="A100-80GB", memory_mib=81920)
    assert submitter.post(URL, GANG, format="json").status_code == 201
    node.delete()
    assert submitter.post(URL, GANG, format="json").status_code == 400


def test_a_change_is_announced_only_when_it_commits(transactional_db, live_redis):
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    with pytest.raises(RuntimeError), transaction.atomic():
        registry.register_node(registration("b", 8))
        raise RuntimeError("rolled back")
    assert registry.cluster_inventory().total_gpus == 4


def test_a_silent_writer_is_seen_within_the_maximum_age(transactional_db, live_redis, monkeypatch):
    """QuerySet.update sends no signal (monitoring.services.health revives nodes that way): the
    inventory is reread at least every INVENTORY_MAX_AGE_S."""
    registry.register_node(registration("a", 4))
    Node.objects.filter(name="a").update(state=NodeHealth.LOST)
    assert registry.cluster_inventory().total_gpus in (0, 4)
    monkeypatch.setattr(registry, "INVENTORY_MAX_AGE_S", 0.0)
    assert registry.cluster_inventory().total_gpus == 0


def test_a_redis_that_lost_the_version_makes_every_process_reload(transactional_db, live_redis, redis_client):
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    Node.objects.filter(name="a").update(state=NodeHealth.LOST)  # unannounced
    redis_client.flushall()
    assert registry.cluster_inventory().total_gpus == 0


def test_without_redis_the_inventory_is_read_from_the_database(transactional_db, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    Node.objects.filter(name="a").update(state=NodeHealth.LOST)
    assert registry.cluster_inventory().total_gpus == 0


def test_inside_a_transaction_the_inventory_is_never_kept(db, live_redis):
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    Node.objects.filter(name="a").update(state=NodeHealth.LOST)
    assert registry.cluster_inventory().total_gpus == 0


def test_a_node_lost_and_revived_by_its_heartbeat_counts_again_at_once(transactional_db, live_redis, redis_client):
    registry.register_node(registration("a", 4))
    assert registry.cluster_inventory().total_gpus == 4
    assert health.mark_lost(Node.objects.get(name="a"))  # health announces it: no manual step
    assert registry.cluster_inventory().total_gpus == 0
    redis_client.set(heartbeat_key("a"), "{}", ex=60)  # a hung agent that recovered
    fresh = {"a": {"ts": time.time(), "running_jobs": []}}
    assert health.revive_heartbeating(redis_client, fresh, lambda names: {}) == ["a"]
    assert registry.cluster_inventory().total_gpus == 4


def test_the_gpu_query_returns_one_row_per_node_model_and_memory(db):
    """Not one row per GPU: the model's default ordering (node name, index) must not reach the query."""
    registry.register_node(registration("a", 8))
    registry.register_node(registration("b", 8))
    registry.register_node(registration("c", 4, model="V100-32GB", memory=32768))
    with CaptureQueriesContext(connection) as queries:
        groups = registry.present_gpu_groups()
    assert sorted((model, memory, gpus) for _, model, memory, gpus in groups) == [
        ("A100-80GB", 81920, 8), ("A100-80GB", 81920, 8), ("V100-32GB", 32768, 4)]
    [query] = queries.captured_queries
    assert "ORDER BY" not in query["sql"] and '"monitoring_node"."name"' not in query["sql"]


def test_the_inventory_answers_per_kind_of_node_as_per_gpu(db):
    for n in range(3):
        registry.register_node(registration(f"a{n}", 8))
    registry.register_node(registration("v", 4, model="V100-32GB", memory=32768))
    registry.register_node(registration("mixed", 0))
    Gpu.objects.bulk_create([Gpu(node=Node.objects.get(name="mixed"), index=i, uuid=f"GPU-m-{i}",
                                 model=("A100-80GB" if i < 2 else "V100-32GB"), memory_mib=(81920 if i < 2 else 32768))
                             for i in range(4)])
    inventory = registry.load_inventory()
    assert len(inventory.node_kinds) == 3
    assert inventory.total_gpus == 32 and inventory.gpus_per_node == (8, 8, 8, 4, 4)
    assert inventory.models == {"A100-80GB", "V100-32GB"} and inventory.largest_gpu_mib == 81920
    assert inventory.fitting_per_node({"V100-32GB"}, None) == (4, 2, 0, 0, 0)
    assert inventory.fitting_per_node((), 40000) == (8, 8, 8, 2, 0)
    assert inventory.fitting_per_node_by_model((), None) == {"A100-80GB": (8, 8, 8, 2, 0),
                                                             "V100-32GB": (4, 2, 0, 0, 0)}
    assert inventory.largest_mib_of({"V100-32GB"}) == 32768
    assert inventory.widest_nodes(2) == 16
    assert not Job.objects.exists()
