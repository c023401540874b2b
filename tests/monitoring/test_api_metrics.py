"""/api/v1/nodes/, /gpus/, /metrics/heatmap/, /metrics/occupancy/ and /jobs/{id}/metrics/."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.models import Allocation, Job
from monitoring.choices import Resolution
from monitoring.models import JobRollup
from monitoring.services import live
from monitoring.services.heatmap import RANGES, gpu_heatmap
from tests.factories import rollup, running_job


def test_nodes_list_gpus_with_live_readings(cluster, alice, api, live_redis, redis_client):
    live.store_latest(redis_client, [protocol.NodeSample(
        node="v1", ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=0, util_sm=42.0, mem_used_mib=1024, mem_total_mib=32768, temperature_c=61)],
    )])
    nodes = {n["name"]: n for n in api(alice).get("/api/v1/nodes/").json()}
    assert set(nodes) == {"a1", "v1"}
    assert nodes["a1"]["rack"] == "r1" and len(nodes["a1"]["gpus"]) == 4
    v1 = api(alice).get("/api/v1/nodes/v1/").json()
    assert v1["gpus"][0]["live"]["util_sm"] == 42.0 and v1["gpus"][0]["live"]["temperature_c"] == 61
    assert v1["gpus"][1]["live"] is None
    assert api(alice).get("/api/v1/nodes/nope/").status_code == 404
    gpus = api(alice).get("/api/v1/gpus/", {"node": "v1"}).json()
    assert gpus["count"] == 2 and {g["model"] for g in gpus["results"]} == {"V100-32GB"}


def test_nodes_answer_without_redis(cluster, alice, api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    assert api(alice).get("/api/v1/nodes/a1/").json()["gpus"][0]["live"] is None


@pytest.mark.parametrize("range_key, column_s, columns", [("1h", 10, 360), ("6h", 60, 360), ("24h", 300, 288),
                                                         ("7d", 1800, 336)])
def test_each_range_keeps_a_few_hundred_columns(cluster, range_key, column_s, columns):
    heatmap = gpu_heatmap(range_key, "util")
    assert (heatmap.column_s, heatmap.columns) == (column_s, columns)
    assert RANGES[range_key].seconds == column_s * columns
    assert len(heatmap.values) == 6 and all(len(row) == columns for row in heatmap.values)


def test_heatmap_rows_grouped_by_rack_and_node_with_values(cluster, alice, api):
    now = timezone.now().replace(microsecond=0)
    bucket = now - timedelta(seconds=now.second % 10) - timedelta(seconds=30)
    rollup(cluster["v1/1"], bucket, util=80.0, mem=16384)
    rollup(cluster["v1/1"], bucket + timedelta(seconds=10), util=40.0, mem=8192)
    body = api(alice).get("/api/v1/metrics/heatmap/", {"range": "1h"}).json()
    assert [g["node"] for g in body["groups"]] == ["a1", "v1"]
    assert [(g["first_row"], g["rows"]) for g in body["groups"]] == [(0, 4), (4, 2)]
    row = [r["gpu_id"] for r in body["rows"]].index(cluster["v1/1"].pk)
    values = [v for v in body["values"][row] if v is not None]
    assert values == [80.0, 40.0]
    assert len(body["columns"]) == 360 and body["column_s"] == 10
    memory = api(alice).get("/api/v1/metrics/heatmap/", {"range": "1h", "metric": "mem", "node": "v1"}).json()
    assert [r["node"] for r in memory["rows"]] == ["v1", "v1"]
    assert [v for v in memory["values"][1] if v is not None] == [50.0, 25.0]  # % of 32 GiB


def test_wide_ranges_merge_minute_rollups_with_newer_ten_second_ones(cluster):
    gpu = cluster["a1/0"]
    now = timezone.now().replace(second=0, microsecond=0)
    old_minute = now - timedelta(minutes=30)
    rollup(gpu, old_minute, util=20.0, resolution=Resolution.ONE_MINUTE)
    rollup(gpu, old_minute, util=99.0)  # compacted already: must not count twice
    rollup(gpu, now - timedelta(minutes=1) + timedelta(seconds=10), util=60.0)  # after the last compaction
    heatmap = gpu_heatmap("6h", "util")
    assert [v for v in heatmap.values[0] if v is not None] == [20.0, 60.0]


def test_heatmap_refuses_unknown_range_and_metric(alice, api):
    response = api(alice).get("/api/v1/metrics/heatmap/", {"range": "2y", "metric": "heat"})
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"range", "metric"}
    assert api(alice).get("/api/v1/metrics/occupancy/", {"range": "2y"}).status_code == 400


def test_occupancy_lists_jobs_per_gpu_within_the_range(cluster, alice, vision, api):
    job = running_job(vision, alice, [cluster["a1/0"]])
    old = running_job(vision, alice, [cluster["a1/1"]])
    Allocation.objects.filter(job=old).update(created_at=timezone.now() - timedelta(hours=3),
                                              released_at=timezone.now() - timedelta(hours=2))
    one_hour = api(alice).get("/api/v1/metrics/occupancy/", {"range": "1h"}).json()["gpus"]
    assert list(one_hour) == [str(cluster["a1/0"].pk)]
    assert one_hour[str(cluster["a1/0"].pk)][0]["end"] is None
    six_hours = api(alice).get("/api/v1/metrics/occupancy/", {"range": "6h", "node": "a1"}).json()["gpus"]
    assert six_hours[str(cluster["a1/1"].pk)][0]["job"] == old.pk
    assert api(alice).get("/api/v1/metrics/occupancy/", {"range": "6h", "node": "v1"}).json()["gpus"] == {}
    assert job.pk  # still running, listed above


def test_job_series_from_job_rollups(cluster, alice, vision, api):
    job = running_job(vision, alice, [cluster["a1/0"]], gpu_memory_mib=20000)
    started = timezone.now() - timedelta(minutes=2)
    Job.objects.filter(pk=job.pk).update(started_at=started, placed_at=started)
    start = started.replace(second=started.second // 10 * 10, microsecond=0)
    for n, (mem, util) in enumerate([(1000, 10.0), (12000, 85.0)]):
        JobRollup.objects.create(job_id=job.pk, resolution=10, bucket_start=start + timedelta(seconds=10 * n),
                                 samples=2, mem_max=mem, util_sum=util * 2, util_n=2)
    JobRollup.objects.create(job_id=job.pk + 1, resolution=10, bucket_start=start, samples=1, mem_max=5, util_n=0)
    body = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    assert body["step_s"] == 10 and body["gpu_memory_mib"] == 20000
    assert [(p["mem_max_mib"], p["util"]) for p in body["points"]] == [(1000, 10.0), (12000, 85.0)]


def test_job_that_never_started_has_no_series(alice, vision, api):
    from tests.factories import JobFactory

    job = JobFactory(tenant=vision, owner=alice)
    assert api(alice).get(f"/api/v1/jobs/{job.pk}/metrics/").json()["points"] == []
