"""Each GPU's isolation mode as its agent registers it (through the real agent-event reader), and
where operators and researchers read it: the node API, the node page, the node list, and the
inventory submissions are checked against (MIG instances are not whole GPUs)."""

from __future__ import annotations

import re

from agents import protocol
from jobs.services.agent_events import consume_events
from monitoring.models import Gpu
from monitoring.services.registry import load_inventory


def register(redis_client, node: str, gpus: list[protocol.GpuInfo]) -> None:
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.NodeRegistered(
        node=node, gpus=gpus, backend="nvml", agent_version="t", hostname=node)))
    assert consume_events(redis_client) == 1


def h100_half_mig(node="h1") -> list[protocol.GpuInfo]:
    """GPU 0 whole under MPS, GPU 1 whole with nothing enforcing shares, GPU 2 split into two 3g.40gb
    instances (devices 2 and 3)."""
    return [
        protocol.GpuInfo(index=0, uuid=f"GPU-{node}-0", model="H100-80GB", memory_mib=81559, isolation="mps"),
        protocol.GpuInfo(index=1, uuid=f"GPU-{node}-1", model="H100-80GB", memory_mib=81559),
        *(protocol.GpuInfo(index=2 + i, uuid=f"MIG-{node}-2-{i}", model="H100-80GB", memory_mib=40192,
                           isolation="mig", mig_profile="3g.40gb", parent_index=2) for i in range(2)),
    ]


def test_registration_stores_each_gpus_isolation_and_an_agent_that_says_nothing_is_unfenced(
        db, redis_client, live_redis):
    register(redis_client, "h1", h100_half_mig())
    stored = {g.index: (g.uuid, g.isolation, g.mig_profile, g.parent_index)
              for g in Gpu.objects.filter(node__name="h1", present=True)}
    assert stored == {0: ("GPU-h1-0", "mps", None, None), 1: ("GPU-h1-1", "unfenced", None, None),
                      2: ("MIG-h1-2-0", "mig", "3g.40gb", 2), 3: ("MIG-h1-2-1", "mig", "3g.40gb", 2)}


def test_a_reregistration_changes_the_mode(db, redis_client, live_redis):
    """The agent found the driver's memory limits after an upgrade: the GPU is fenced from then on."""
    gpu = protocol.GpuInfo(index=0, uuid="GPU-x", model="A100-80GB", memory_mib=81920)
    register(redis_client, "n1", [gpu])
    register(redis_client, "n1", [gpu.model_copy(update={"isolation": "memory_limit"})])
    assert Gpu.objects.get(uuid="GPU-x").isolation == "memory_limit"


def test_a_mig_instance_without_its_profile_is_dead_lettered_not_half_stored(db, redis_client, live_redis):
    fields = protocol.encode(protocol.NodeRegistered(
        node="bad", gpus=[protocol.GpuInfo(index=0, uuid="GPU-b", model="H100-80GB", memory_mib=81559)],
        backend="nvml", agent_version="t", hostname="bad"))
    # What a broken (or hostile) agent could write: "mig" with no profile or parent.
    fields["m"] = fields["m"].replace('"isolation":"unfenced"', '"isolation":"mig"')
    redis_client.xadd(protocol.EVENTS_STREAM, fields)
    consume_events(redis_client)
    assert not Gpu.objects.filter(uuid="GPU-b").exists()
    assert redis_client.xlen(protocol.DEAD_LETTER_STREAM) == 1


def test_the_node_api_shows_isolation_per_gpu(db, api, alice, redis_client, live_redis):
    register(redis_client, "h1", h100_half_mig())
    gpus = api(alice).get("/api/v1/nodes/h1/").json()["gpus"]
    assert [(g["index"], g["isolation"], g["mig_profile"], g["parent_index"]) for g in gpus] == [
        (0, "mps", None, None), (1, "unfenced", None, None), (2, "mig", "3g.40gb", 2), (3, "mig", "3g.40gb", 2)]
    listed = api(alice).get("/api/v1/nodes/").json()
    assert [g["isolation"] for node in listed for g in node["gpus"]] == ["mps", "unfenced", "mig", "mig"]


def _isolation_cell(page: str, index: int) -> str:
    row = re.search(rf'<tr data-index="{index}">(.*?)</tr>', page, re.S).group(1)
    return re.sub(r"\s+", " ", re.search(r'<td class="isolation"[^>]*>(.*?)</td>', row, re.S).group(1))


def test_the_node_page_says_how_each_gpu_fences_its_jobs(db, web, alice, redis_client, live_redis):
    register(redis_client, "h1", h100_half_mig())
    page = web(alice).get("/nodes/h1/").content.decode()
    assert "<th>Isolation</th>" in page
    assert _isolation_cell(page, 0) == "MPS (memory and compute limits per job)"
    assert _isolation_cell(page, 1) == "Unfenced (no limits: shared only by jobs that accept it)"
    assert _isolation_cell(page, 2) == 'MIG 3g.40gb <span class="muted">of GPU 2: one job, fenced in hardware</span>'
    assert 'data-isolation="mig"' in page


def test_the_node_list_counts_gpus_per_mode(db, web, alice, redis_client, live_redis):
    register(redis_client, "h1", h100_half_mig())
    page = web(alice).get("/nodes/").content.decode()
    cell = re.search(r'<tr data-node="h1">.*?<td class="isolation">(.*?)</td>', page, re.S).group(1)
    assert cell == "2 mig, 1 mps, 1 unfenced"


def test_mig_instances_are_offered_by_profile_not_as_whole_gpus(db, redis_client, live_redis):
    register(redis_client, "h1", h100_half_mig())
    inventory = load_inventory()
    assert (inventory.total_gpus, inventory.largest_gpu_mib) == (2, 81559)
    assert inventory.mig_profiles == (("3g.40gb", 40192),)
    assert inventory.largest_mig_mib("3g.40gb") == 40192 and inventory.largest_mig_mib("1g.10gb") is None
