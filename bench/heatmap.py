"""Heatmap latency: the cluster heatmap API for 512 GPUs x 6 h, end to end through DRF.

    python bench/heatmap.py --nodes 64 --hours 6

Fills a throw-away database (PostgreSQL when one answers) with 1 min rollups for every GPU over
the range plus the last minutes of 10 s rollups, then times ``GET /api/v1/metrics/heatmap/``
(and the occupancy overlay) with Django's test client: median and p95 over repeated requests.
Baseline in the same run: one plain SQL scan that only counts the rollup rows in the range, i.e.
the least any heatmap could cost on this database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import setup  # noqa: E402

GPUS_PER_NODE = 8


def populate(nodes: int, hours: float) -> None:
    from django.utils import timezone

    from monitoring.models import Gpu, GpuRollup, Node

    now = timezone.now().replace(second=0, microsecond=0)
    node_rows = Node.objects.bulk_create([Node(name=f"node{i:03d}", registered_at=now, rack=f"rack{i // 16}")
                                          for i in range(nodes)])
    gpus = Gpu.objects.bulk_create([Gpu(node=n, index=i, uuid=f"GPU-{n.name}-{i}", model="A100-80GB",
                                        memory_mib=81920) for n in node_rows for i in range(GPUS_PER_NODE)])
    minutes = int(hours * 60)
    batch = []
    for gpu in gpus:
        for m in range(minutes):
            util = float((gpu.id * 7 + m) % 100)
            batch.append(GpuRollup(gpu=gpu, resolution=60, bucket_start=now - timedelta(minutes=minutes - m),
                                   samples=60, util_sum=util * 60, util_n=60, util_max=util, mem_sum=60 * 40000.0,
                                   mem_n=60, mem_max=40000, temp_max=60.0))
            if len(batch) >= 20_000:
                GpuRollup.objects.bulk_create(batch)
                batch = []
        for s in range(0, 300, 10):  # the not-yet-compacted tail
            batch.append(GpuRollup(gpu=gpu, resolution=10, bucket_start=now + timedelta(seconds=s), samples=10,
                                   util_sum=500.0, util_n=10, util_max=50.0, mem_sum=400000.0, mem_n=10,
                                   mem_max=40000))
    GpuRollup.objects.bulk_create(batch)
    from django.db import connection

    if connection.vendor == "postgresql":  # as autovacuum would have: plans need row counts
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE monitoring_gpurollup; ANALYZE monitoring_gpu")


CPU: dict[str, list[float]] = {}


def timed(fn, repeat: int) -> list[float]:
    """Wall seconds of each call; this process's CPU seconds go to ``CPU[fn.__name__]`` (wall time
    moves with the machine's load, CPU time much less)."""
    times, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    CPU[fn.__name__] = cpu
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    args = parser.parse_args()
    db_label, redis_server = setup(args.database)
    import os

    os.environ["REDIS_URL"] = redis_server.url
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.test import APIClient

    populate(args.nodes, args.hours)
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("viewer"))

    def heatmap():
        response = client.get("/api/v1/metrics/heatmap/", {"range": "6h", "metric": "util"})
        assert response.status_code == 200, response.content[:300]
        return response

    def occupancy():
        response = client.get("/api/v1/metrics/occupancy/", {"range": "6h"})
        assert response.status_code == 200, response.content[:300]

    def floor():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM monitoring_gpurollup WHERE bucket_start >= %s",
                           [__import__("django.utils.timezone", fromlist=["now"]).now() - timedelta(hours=args.hours)])
            cursor.fetchone()

    from django.core.cache import cache

    def cold_heatmap():
        cache.clear()  # no settled block cached: every column read from the rollups
        return heatmap()

    from monitoring.services.heatmap import warm_settled_blocks

    warm_runs: list[tuple[int, float, float]] = []  # (blocks computed, wall s, CPU s) of each warmer run

    def warm_from_scratch():
        cache.clear()  # as after a restart, a quiet night or a new GPU, once the beat's warmer has run
        while True:
            started, started_cpu = time.perf_counter(), time.process_time()
            computed = warm_settled_blocks()
            warm_runs.append((computed, time.perf_counter() - started, time.process_time() - started_cpu))
            if not computed:
                break

    body = cold_heatmap().json()
    cold = timed(cold_heatmap, args.repeat)
    CPU["cold"] = CPU.pop("cold_heatmap", [])
    warmed = []
    for _ in range(args.repeat):
        warm_from_scratch()  # (not timed: the beat's work, reported on its own below)
        warmed += timed(heatmap, 1)
        CPU.setdefault("warmed", []).extend(CPU.pop("heatmap"))
    heat = timed(heatmap, args.repeat)
    occ = timed(occupancy, args.repeat)
    base = timed(floor, args.repeat)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1000  # noqa: E731
    print(f"heatmap bench: {args.nodes * GPUS_PER_NODE} GPUs x {args.hours:g} h, {db_label}, "
          f"{len(body['rows'])} rows x {len(body['columns'])} columns, {args.repeat} requests each")
    print(f"  GET heatmap (6h, util)   : median {statistics.median(heat) * 1000:.0f} ms, p95 {q(heat, 0.95):.0f} ms; "
          f"Python CPU median {statistics.median(CPU['heatmap']) * 1000:.0f} ms")
    print(f"  same, cache cold         : median {statistics.median(cold) * 1000:.0f} ms, p95 {q(cold, 0.95):.0f} ms; "
          f"Python CPU median {statistics.median(CPU['cold']) * 1000:.0f} ms (settled columns read again)")
    print(f"  same, after the warmer   : median {statistics.median(warmed) * 1000:.0f} ms, p95 {q(warmed, 0.95):.0f} ms; "
          f"Python CPU median {statistics.median(CPU['warmed']) * 1000:.0f} ms (the beat's warmer ran first)")
    busy = [(n, w, c) for n, w, c in warm_runs if n]
    idle = [(w, c) for n, w, c in warm_runs if not n]
    print(f"  warmer (beat, every 60 s): {statistics.median(c / n for n, _, c in busy) * 1000:.0f} ms Python CPU and "
          f"{statistics.median(w / n for n, w, _ in busy) * 1000:.0f} ms wall per block computed "
          f"({statistics.median(n for n, _, _ in busy):.0f} blocks a run at most); a run with nothing to compute "
          f"{statistics.median(c for _, c in idle) * 1000:.0f} ms CPU, {statistics.median(w for w, _ in idle) * 1000:.0f} ms wall")
    print(f"  GET occupancy (6h)       : median {statistics.median(occ) * 1000:.0f} ms, p95 {q(occ, 0.95):.0f} ms")
    print(f"  baseline: count rows SQL : median {statistics.median(base) * 1000:.0f} ms  -> heatmap = "
          f"{statistics.median(heat) / statistics.median(base):.1f}x the bare scan")
    redis_server.stop()


if __name__ == "__main__":
    main()
