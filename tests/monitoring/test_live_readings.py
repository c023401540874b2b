"""Live GPU readings (``monitoring.services.live.GpuReading``) where people read them: the node
page's GPU table and the overview's live numbers (/api/v1/cluster/)."""

from __future__ import annotations

import re
import time

from agents import protocol
from monitoring.services import live


def _report(redis_client, node: str, gpus: list[protocol.GpuSample], age_s: float = 0.0) -> None:
    live.store_latest(redis_client, [protocol.NodeSample(node=node, ts=time.time() - age_s, seq=1, gpus=gpus)])


def _row(page: str, index: int) -> str:
    return re.search(rf'<tr data-index="{index}">(.*?)</tr>', page, re.S).group(1)


def test_node_page_shows_each_gpus_latest_reading(cluster, alice, web, live_redis, redis_client):
    _report(redis_client, "a1", [
        protocol.GpuSample(index=0, util_sm=37.0, mem_used_mib=20480, mem_total_mib=81920, temperature_c=64.4,
                           power_w=251.6),
        protocol.GpuSample(index=1, mem_total_mib=81920),  # a GPU that could not tell its utilisation
    ])
    page = web(alice).get("/nodes/a1/").content.decode()
    busy, quiet, silent = _row(page, 0), _row(page, 1), _row(page, 2)
    assert 'style="width:37.0%"' in busy and "37%" in busy
    assert "20 GiB of 80 GiB" in busy and "64 °C" in busy and "252 W" in busy
    assert "no samples" not in quiet and "80 GiB" in quiet and "°C" not in quiet
    assert "no samples" in silent  # a GPU its node did not report on


def test_a_node_heard_from_long_ago_shows_no_readings(cluster, alice, web, live_redis, redis_client):
    _report(redis_client, "a1", [protocol.GpuSample(index=0, util_sm=90.0)], age_s=live.STALE_AFTER_S + 5)
    assert "no samples" in _row(web(alice).get("/nodes/a1/").content.decode(), 0)


def test_overview_sums_the_live_readings(cluster, alice, api, live_redis, redis_client):
    _report(redis_client, "a1", [
        protocol.GpuSample(index=0, util_sm=30.0, mem_used_mib=1000, mem_total_mib=80000),
        protocol.GpuSample(index=1, util_sm=61.0, mem_used_mib=500, mem_total_mib=80000),
    ])
    _report(redis_client, "v1", [protocol.GpuSample(index=0, mem_total_mib=32768)])  # no utilisation known
    assert api(alice).get("/api/v1/cluster/").json()["live"] == {
        "gpus_reporting": 3, "util_mean": 45.5, "mem_used_mib": 1500, "mem_total_mib": 192768,
    }


def test_overview_without_redis_reports_no_gpus(cluster, alice, api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    assert api(alice).get("/api/v1/cluster/").json()["live"] == {
        "gpus_reporting": 0, "util_mean": None, "mem_used_mib": 0, "mem_total_mib": 0,
    }


def test_an_entry_that_is_not_a_sample_is_passed_over_and_pruned(cluster, alice, api, live_redis, redis_client):
    """Something other than the ingest wrote the live hash (a bug, a hostile client on the same
    Redis): the other nodes' readings, the scheduling loop's snapshot and the pruning go on."""
    from jobs.services.snapshot_loader import build_snapshot

    _report(redis_client, "a1", [protocol.GpuSample(index=0, util_sm=30.0, mem_total_mib=80000)])
    redis_client.hset(live.NODE_HASH, mapping={"v1": b"\xff not json", "x9": b"[1, 2]", "x8": b'{"ts": "soon"}',
                                               "x7": b'{"ts": %f}' % time.time()})
    assert set(live.latest_nodes(redis_client)) == {"a1"}
    assert api(alice).get("/api/v1/cluster/").json()["live"]["gpus_reporting"] == 1
    assert build_snapshot(redis_client).nodes  # (the loop's snapshot reads the same hash)
    assert live.prune_stale(redis_client) == 4
    assert set(redis_client.hkeys(live.NODE_HASH)) == {b"a1"}
