"""Settled heatmap columns are served from the cache, in blocks shared by every request of the
same range, metric and GPUs: the matrix is the one computed from the rollups however the clock
moves, and only columns newer than ``SETTLED_S`` are read from the rollups again."""

import random
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.core.cache import cache

from monitoring.models import GpuRollup
from monitoring import tasks
from monitoring.services import heatmap
from tests.factories import GpuFactory, NodeFactory

NOW = datetime(2026, 11, 23, 12, 7, 33, tzinfo=dt_timezone.utc)


@pytest.fixture
def gpus(db):
    rng = random.Random(3)
    node = NodeFactory(name="c1")
    gpus = [GpuFactory(node=node, index=i) for i in range(2)]
    rows = []
    for gpu in gpus:
        t = (NOW - timedelta(hours=2)).replace(second=0)  # buckets start on 10 s boundaries
        while t < NOW + timedelta(minutes=30):
            rows.append(GpuRollup(gpu=gpu, resolution=10, bucket_start=t, samples=10, util_sum=rng.uniform(0, 1000),
                                  util_n=10, util_max=100.0, mem_sum=0.0, mem_n=1, mem_max=rng.randint(0, 80000),
                                  temp_max=50.0))
            t += timedelta(seconds=10)
    GpuRollup.objects.bulk_create(rows)
    return gpus


def fresh(range_key, metric, now):
    cache.clear()
    return heatmap.gpu_heatmap(range_key, metric, now=now).values


@pytest.mark.parametrize("metric", heatmap.METRICS)
def test_the_cached_matrix_is_the_computed_one_as_time_moves_on(gpus, metric):
    for step in range(0, 25 * 60, 170):  # across block boundaries, one request every ~3 minutes
        now = NOW + timedelta(seconds=step)
        served = heatmap.gpu_heatmap("1h", metric, now=now).values
        assert served == fresh("1h", metric, now), step
        heatmap.gpu_heatmap("1h", metric, now=now)  # warm again for the next step


def test_only_unsettled_columns_are_read_again(gpus):
    first = heatmap.gpu_heatmap("1h", "util", now=NOW)
    old_column, new_column = 30, first.columns - 2  # 55 minutes ago; 20 seconds ago
    for column in (old_column, new_column):
        at = first.start + timedelta(seconds=column * first.column_s)
        GpuRollup.objects.filter(gpu=gpus[0], resolution=10, bucket_start=at).update(util_sum=0.0)
    again = heatmap.gpu_heatmap("1h", "util", now=NOW)
    assert again.values[0][new_column] == 0.0  # the newest columns come from the rollups
    assert again.values[0][old_column] == first.values[0][old_column] != 0.0  # settled: from the cache
    assert again.values[1] == first.values[1]


def test_another_set_of_gpus_has_blocks_of_its_own(gpus):
    cluster = heatmap.gpu_heatmap("1h", "mem", now=NOW)
    node = heatmap.gpu_heatmap("1h", "mem", now=NOW, nodes=["c1"])
    GpuFactory(node=NodeFactory(name="c2"), index=0)  # a GPU arrives: the cluster's rows change
    grown = heatmap.gpu_heatmap("1h", "mem", now=NOW)
    assert node.values == cluster.values
    assert len(grown.values) == 3 and grown.values[:2] == cluster.values and set(grown.values[2]) == {None}


def warm_until_done(now) -> list[int]:
    """Run the beat's warmer until it has nothing left to compute; what each run computed."""
    runs = []
    while computed := heatmap.warm_settled_blocks(now):
        runs.append(computed)
        assert len(runs) < 20
    return runs


@pytest.mark.parametrize("metric", heatmap.METRICS)
def test_after_the_warmer_a_first_view_reads_only_its_unsettled_columns(gpus, metric, monkeypatch):
    expected = fresh("1h", metric, NOW)
    cache.clear()
    warm_until_done(NOW)
    reads = []
    real = heatmap._matrix
    monkeypatch.setattr(heatmap, "_matrix",
                        lambda cells, since, until: reads.append((since, until)) or real(cells, since, until))
    served = heatmap.gpu_heatmap("1h", metric, now=NOW)
    assert served.values == expected
    cells = heatmap.Cells.of(metric, served.rows, heatmap.RANGES["1h"])
    blocks = heatmap._settled_blocks(cells, *heatmap._window(cells.span, NOW), int(NOW.timestamp()))
    assert len(blocks) >= 4
    assert reads == [(blocks[-1] + cells.block_s, served.end.timestamp())]  # one read: the unsettled columns


def test_the_warmer_computes_a_bounded_number_of_blocks_per_run_newest_first(gpus):
    cache.clear()
    runs = warm_until_done(NOW)
    per_run = heatmap.WARM_BLOCKS_PER_RUN * len(heatmap.WARMED_RANGES) * len(heatmap.METRICS)
    assert runs[0] == per_run and all(n <= per_run for n in runs)
    assert heatmap.warm_settled_blocks(NOW) == 0  # nothing settled is missing any more
    cache.clear()
    heatmap.warm_settled_blocks(NOW)
    cells = heatmap.Cells.of("util", heatmap._rows(heatmap._gpus(None)), heatmap.RANGES["1h"])
    blocks = heatmap._settled_blocks(cells, *heatmap._window(cells.span, NOW), int(NOW.timestamp()))
    cached = [b for b in blocks if cache.has_key(cells.key(b))]
    assert cached == blocks[-heatmap.WARM_BLOCKS_PER_RUN:]  # the newest first: what a view shows first


def test_the_warmer_runs_from_the_beat_schedule(gpus):
    from cluster_ui.celery import app
    from django.conf import settings

    app.loader.import_default_modules()  # what a worker does when it starts: the tasks it will know
    entries = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "monitoring.tasks.warm_heatmap" in entries
    assert entries <= set(app.tasks), entries - set(app.tasks)  # every entry names a task that exists
    cache.clear()
    assert tasks.warm_heatmap.apply().get() > 0
