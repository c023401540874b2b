"""The heatmap PostgreSQL computes (one array per GPU) is cell for cell the one built from rollup
rows read one by one, for every range and metric, with minute and ten-second rollups mixed and a
compaction point inside a column."""

import random
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.core.cache import cache
from django.db import connection

from monitoring.models import GpuRollup
from monitoring.services import heatmap
from tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the fast path is PostgreSQL's")

NOW = datetime(2026, 11, 23, 12, 7, 33, tzinfo=dt_timezone.utc)


@pytest.fixture
def rollups(db):
    rng = random.Random(7)
    node = NodeFactory(name="a1")
    gpus = [GpuFactory(node=node, index=i, memory_mib=rng.choice([32768, 81920])) for i in range(3)]
    # Minute rollups over the last 7 days up to a compaction point that is not on a column
    # boundary, then ten-second rollups from a while before it (they overlap, as after compaction).
    compacted = NOW - timedelta(minutes=13)
    rows = []
    for gpu in gpus:
        t = NOW - timedelta(days=7)
        while t < compacted:
            if rng.random() < 0.3:  # sparse: a week of minutes for three GPUs stays quick
                rows.append(_rollup(gpu, 60, t, rng))
            t += timedelta(minutes=rng.choice([1, 7, 31]))
        t = compacted - timedelta(hours=2)
        while t < NOW:
            if rng.random() < 0.8:
                rows.append(_rollup(gpu, 10, t, rng))
            t += timedelta(seconds=10)
    GpuRollup.objects.bulk_create(rows)


def _rollup(gpu, resolution, start, rng):
    util_n = rng.choice([0, 1, resolution])
    # Halves (x.x5) on purpose: both paths must round them the same way.
    util = rng.choice([12.25, 33.35, 0.05, 99.95, rng.uniform(0, 100)])
    return GpuRollup(gpu=gpu, resolution=resolution, bucket_start=start.replace(second=start.second // 10 * 10,
                                                                                 microsecond=0),
                     samples=resolution, util_sum=util * util_n, util_n=util_n, util_max=util,
                     mem_sum=0.0, mem_n=1, mem_max=rng.choice([None, 0, 16384, rng.randint(1, gpu.memory_mib)]),
                     temp_max=50.0)


@pytest.mark.parametrize("range_key", list(heatmap.RANGES))
@pytest.mark.parametrize("metric", heatmap.METRICS)
def test_postgresql_computes_the_same_matrix_as_the_cell_by_cell_path(rollups, range_key, metric, monkeypatch):
    fast = heatmap.gpu_heatmap(range_key, metric, now=NOW)
    cache.clear()  # (settled columns are cached: the reference must compute its own)
    monkeypatch.setattr(heatmap, "_values_in_postgresql", heatmap._values_in_python)
    reference = heatmap.gpu_heatmap(range_key, metric, now=NOW)
    assert connection.vendor == "postgresql"
    assert sum(v is not None for row in reference.values for v in row) > 10  # there is something to compare
    # Where a column averages several rollups the two paths add floats in different orders, and a
    # mean that lands on a half may round either way: one tenth, never more, and never a hole.
    slack = 0.0 if range_key == "1h" else 0.1 + 1e-9
    differ = [(r, c, a, b) for r, (x, y) in enumerate(zip(fast.values, reference.values))
              for c, (a, b) in enumerate(zip(x, y))
              if (a is None) != (b is None) or (a is not None and abs(a - b) > slack)]
    assert not differ, differ[:10]


def test_both_paths_round_a_tenth_the_same_way(db):
    from django.db import connection

    values = [12.25, 1.45, 0.05, 99.95, 33.35, 0.15, 2.5, 57.123456]
    with connection.cursor() as cursor:
        cursor.execute("SELECT round(v * 10) / 10 FROM unnest(%s::float8[]) v", [values])
        assert [heatmap.round1(v) for v in values] == [row[0] for row in cursor.fetchall()]
