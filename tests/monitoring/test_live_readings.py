"""Live GPU readings (``monitoring.services.live.GpuReading``) where people read them: the node
page's GPU table and the overview's live numbers (/api/v1/cluster/); and where the scheduling
loop reads them, whatever else was written into the live hash."""

from __future__ import annotations

import json
import re
import time

import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from monitoring.services import live
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


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


def _sample_json(node: str, *, ts: float | None = None, util=40.0, mem=7000, job_id=None, job_util=10.0) -> str:
    sample = {"v": 1, "kind": "node_sample", "node": node, "ts": time.time() if ts is None else ts, "seq": 1,
              "gpus": [{"index": 0, "util_sm": util, "mem_total_mib": 81920, "mem_used_mib": mem}]}
    if job_id is not None:
        sample["jobs"] = [{"job_id": job_id, "gpu_index": 0, "mem_used_mib": 100, "util_sm": job_util}]
    return json.dumps(sample)


def _one_running_job():
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    job = JobFactory(tenant=TenantFactory(slug="vision"), state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=gpu)
    return job, gpu


def test_a_sample_the_schema_takes_loosely_reaches_the_scheduler_with_its_readings(db, redis_client):
    """The ingest's strict decoder passes 7000.0 for an int to the schema, which takes it: the
    sample is stored as the schema reads it, so the loop's own typed decoder takes it too."""
    from jobs.services.snapshot_loader import build_snapshot
    from monitoring.services import ingest

    job, gpu = _one_running_job()
    raw = _sample_json("n1", mem=7000.0, job_id=job.pk)
    sample = ingest.decode_sample({"m": raw})
    assert isinstance(sample, protocol.NodeSample)  # (taken by the schema, not the fast path)
    live.store_latest(redis_client, [(sample, raw)])
    readings = build_snapshot(redis_client).readings
    assert readings.gpus[gpu.pk] == 0.4 and readings.gpu_memory_used_mib[gpu.pk] == 7000
    assert readings.jobs[job.pk] == 0.1


@pytest.mark.parametrize("entry", [
    pytest.param(lambda job: _sample_json("n1", util=1.7e308), id="huge GPU utilisation"),
    pytest.param(lambda job: _sample_json("n1", util=-1.7e308), id="negative GPU utilisation"),
    pytest.param(lambda job: _sample_json("n1", util=None, job_id=job.pk, job_util=1.7e308), id="huge job utilisation"),
    pytest.param(lambda job: _sample_json("n1", mem=2**70), id="memory past any GPU"),
    pytest.param(lambda job: '{"ts": %f, "gpus": [], "x": %s%s}' % (time.time(), "[" * 1000, "]" * 1000),
                 id="nesting deep enough to exhaust the decoder"),
])
def test_a_forged_live_entry_cannot_stop_the_scheduler_nor_outlive_pruning(db, redis_client, entry):
    """A hostile client on the same Redis writes the live hash (only nodes sign their samples, not
    this hash): the cycle goes on without that node's readings, and pruning removes the entry."""
    from jobs.scheduling import SchedulerConfig, decide
    from jobs.services.snapshot_loader import build_snapshot

    job, gpu = _one_running_job()
    redis_client.hset(live.NODE_HASH, "n1", entry(job))
    snapshot = build_snapshot(redis_client)
    assert gpu.pk not in snapshot.readings.gpus and job.pk not in snapshot.readings.jobs
    decide(snapshot, now=time.time(), config=SchedulerConfig())
    if b"[[[" in redis_client.hget(live.NODE_HASH, "n1"):
        assert live.prune_stale(redis_client) == 1


def test_entries_under_no_node_of_the_inventory_cost_the_loop_nothing(db, redis_client):
    """Names that are not UTF-8, nodes that do not exist, samples dated far ahead: the loop reads
    only its nodes' entries, and pruning drops what is dated too far ahead to ever be fresh."""
    from jobs.services.snapshot_loader import build_snapshot

    _one_running_job()
    redis_client.hset(live.NODE_HASH, mapping={b"\xff\xfe": _sample_json("x"), "ghost": _sample_json("ghost"),
                                               "n1": _sample_json("n1", ts=time.time() + 3600)})
    assert build_snapshot(redis_client).readings.gpus == {}
    assert live.prune_stale(redis_client) == 1  # (the one dated an hour ahead; the others are fresh)
