"""MIG instances are instances of their GPU, not GPUs: a 16-A100 cluster with four A100s split in
three is "16 GPUs (4 split into 12 MIG instances)" in /metrics, on the heatmap and the node list
(the issue saw ``colony_gpus`` 19 and "27 GPUs"). The nodes register through the real agent-event
reader, with the inventory the simulated backend makes of a ``--simulate`` spec."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from agents.backends.simulated import SimulatedBackend
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from monitoring.models import Gpu
from tests.factories import JobFactory

SPECS = {"gpu-1": "8xA100-80GB", "gpu-2": "4xA100-80GB,4xA100-80GB[mig=2x2g.20gb,3g.40gb]"}


def register(redis_client, node: str, spec: str) -> None:
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.NodeRegistered(
        node=node, gpus=SimulatedBackend(spec, node).inventory(), backend="simulated", agent_version="t",
        hostname=node)))
    assert consume_events(redis_client) == 1


def cluster(redis_client) -> None:
    for node, spec in SPECS.items():
        register(redis_client, node, spec)
    assert Gpu.objects.filter(present=True).count() == 24  # 12 whole GPUs and 12 instances: the devices


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def test_metrics_count_physical_gpus_and_mig_instances_by_profile(client, db, redis_client, live_redis):
    cluster(redis_client)
    families = scrape(client)
    assert {s.labels["model"]: s.value for s in families["colony_gpus"].samples} == {"A100-80GB": 16}
    assert families["colony_mig_gpus"].samples[0].value == 4
    instances = {(s.labels["model"], s.labels["profile"]): s.value for s in families["colony_mig_instances"].samples}
    assert instances == {("A100-80GB", "2g.20gb"): 8, ("A100-80GB", "3g.40gb"): 4}


def test_jobs_on_instances_of_one_gpu_allocate_that_gpu_once(client, db, redis_client, live_redis):
    cluster(redis_client)
    board = Gpu.objects.filter(node__name="gpu-2", mig_profile__isnull=False, parent_index=4)
    assert board.count() == 3
    for instance in board:
        Allocation.objects.create(job=JobFactory(), gpu=instance)
    Allocation.objects.create(job=JobFactory(), gpu=Gpu.objects.get(node__name="gpu-1", index=0))
    families = scrape(client)
    assert families["colony_gpus_allocated"].samples[0].value == 2
    assert families["colony_mig_instances_allocated"].samples[0].value == 3


def test_heatmap_totals_count_a_split_gpu_once_and_name_its_instances(db, api, alice, redis_client, live_redis):
    cluster(redis_client)
    answer = api(alice).get("/api/v1/metrics/heatmap/?range=1h").json()
    assert len(answer["rows"]) == 24  # each instance keeps its own row: jobs run on it
    assert answer["totals"] == {"gpus": 16, "mig_gpus": 4, "mig_instances": 12,
                                "label": "16 GPUs (4 split into 12 MIG instances)"}
    instance = next(row for row in answer["rows"] if row["node"] == "gpu-2" and row["index"] == 4)
    assert (instance["mig_profile"], instance["parent_index"]) == ("2g.20gb", 4)
    one_node = api(alice).get("/api/v1/metrics/heatmap/?range=1h&node=gpu-1").json()
    assert one_node["totals"]["label"] == "8 GPUs"


def test_node_list_counts_gpus_not_instances(db, web, alice, redis_client, live_redis):
    cluster(redis_client)
    page = web(alice).get("/nodes/").content.decode()
    assert re.search(r'id="nodes-totals">\s*16 GPUs \(4 split into 12 MIG instances\) on 2 nodes<', page)
    row = re.search(r'<tr data-node="gpu-2">.*?<td class="gpus">(.*?)</td>', page, re.S).group(1)
    assert row == '8 × A100-80GB <span class="muted">(4 split into 12 MIG instances)</span>'
    row = re.search(r'<tr data-node="gpu-1">.*?<td class="gpus">(.*?)</td>', page, re.S).group(1)
    assert row == "8 × A100-80GB"


def test_the_overview_counts_a_split_gpu_once_busy_when_one_instance_is_held(db, api, alice, redis_client,
                                                                               live_redis):
    cluster(redis_client)
    instances = list(Gpu.objects.filter(node__name="gpu-2", parent_index=4))
    for instance in instances[:2]:  # two jobs on two instances of one A100
        Allocation.objects.create(job=JobFactory(), gpu=instance)
    gpus = api(alice).get("/api/v1/cluster/").json()["gpus"]
    assert (gpus["total"], gpus["busy"], gpus["shared"], gpus["idle"]) == (16, 1, 1, 15)
    assert (gpus["mig_instances"], gpus["mig_instances_busy"]) == (12, 2)
