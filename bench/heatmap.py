"""Heatmap latency: the cluster heatmap API for 512 GPUs x 6 h, end to end through DRF.

    python bench/heatmap.py --nodes 64 --hours 6

Fills a throw-away database (PostgreSQL when one answers) with 1 min rollups for every GPU over
the range plus the last minutes of 10 s rollups, then times ``GET /api/v1/metrics/heatmap/``
(and the occupancy overlay) with Django's test client: median and p95 over ``--repeat`` requests
(40 by default; with fewer than 20 the slowest is printed as "max", never as a p95). Each
request's CPU is counted in every process that serves it: this one (the view, DRF, the ORM), the
PostgreSQL backend of its connection and Redis, which holds Django's cache as in production (from
``/proc``), beside wall time; CPU is a mean
per request (``/proc`` counts in 10 ms ticks: exact over all requests, not for one). Baseline in the
same process: one plain SQL scan that only counts the rollup rows in the range, i.e. the least
any heatmap could cost on this database. The database is ``$COLONY_BENCH_DB``, else
``colony_bench_heatmap_<pid>``, dropped at exit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import backend_pid, proc_cpu, setup  # noqa: E402

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


# CPU seconds of each call, by series: (this process, the PostgreSQL backend, Redis).
CPU: dict[str, list[tuple[float, float, float]]] = {}
REDIS_PID: int | None = None
# Fewer requests than this and a "p95" would be the slowest of them: it is printed as the max.
P95_LEAST = 20


def cpu_now() -> tuple[float, float, float]:
    return time.process_time(), proc_cpu(backend_pid()), proc_cpu(REDIS_PID)


def timed(fn, repeat: int) -> list[float]:
    """Wall seconds of each call; the CPU seconds of every process serving it go to
    ``CPU[fn.__name__]`` (wall time moves with the machine's load, CPU time much less)."""
    times, cpu = [], []
    for _ in range(repeat):
        cpu_before = cpu_now()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
        cpu.append(tuple(b - a for a, b in zip(cpu_before, cpu_now())))
    CPU[fn.__name__] = cpu
    return times


def tail(wall: list[float]) -> str:
    """The p95 of ``wall`` (ms) when there are enough requests for one, else their max, named so."""
    ordered = sorted(wall)
    if len(ordered) < P95_LEAST:
        return f"max {ordered[-1] * 1000:.0f} ms (of {len(ordered)})"
    return f"p95 {ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000:.0f} ms"


def cpu_mean(series: str) -> tuple[float, float, float]:
    """Mean CPU seconds of a request of ``series``, per process. A mean, not a median: /proc counts
    the other processes' CPU in 10 ms ticks, too coarse for one request, exact over all of them."""
    runs = CPU[series]
    return tuple(sum(run[i] for run in runs) / len(runs) for i in range(3))


def cpu_text(series: str) -> str:
    python, database, redis = (seconds * 1000 for seconds in cpu_mean(series))
    return (f"CPU mean {python + database + redis:.1f} ms (Python {python:.1f} + PostgreSQL {database:.1f} "
            f"+ Redis {redis:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=40,
                        help=f"requests of each kind (a p95 needs at least {P95_LEAST}; fewer print the max)")
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    args = parser.parse_args()
    # (the settled columns cached in Redis, as in production: its CPU is the cache's)
    db_label, redis_server = setup(args.database, "colony_bench_heatmap", redis_cache=True)
    global REDIS_PID
    REDIS_PID = getattr(getattr(redis_server, "process", None), "pid", None)
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

    warm_runs: list[tuple[int, float, float]] = []  # (blocks computed, wall s, CPU s of all processes) a run

    def warm_from_scratch():
        cache.clear()  # as after a restart, a quiet night or a new GPU, once the beat's warmer has run
        while True:
            started, started_cpu = time.perf_counter(), sum(cpu_now())
            computed = warm_settled_blocks()
            warm_runs.append((computed, time.perf_counter() - started, sum(cpu_now()) - started_cpu))
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
    print(f"heatmap bench: {args.nodes * GPUS_PER_NODE} GPUs x {args.hours:g} h, {db_label}, "
          f"{len(body['rows'])} rows x {len(body['columns'])} columns, {args.repeat} requests each; "
          f"wall time, and CPU of every process serving a request")
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"  GET heatmap (6h, util)   : median {ms(heat):.0f} ms, {tail(heat)}; {cpu_text('heatmap')}")
    print(f"  same, cache cold         : median {ms(cold):.0f} ms, {tail(cold)}; {cpu_text('cold')} "
          f"(settled columns read again)")
    print(f"  same, after the warmer   : median {ms(warmed):.0f} ms, {tail(warmed)}; {cpu_text('warmed')} "
          f"(the beat's warmer ran first)")
    busy = [(n, w, c) for n, w, c in warm_runs if n]
    idle = [(w, c) for n, w, c in warm_runs if not n]
    blocks = sum(n for n, _, _ in busy)
    print(f"  warmer (beat, every 60 s): {sum(c for _, _, c in busy) / blocks * 1000:.1f} ms CPU (all processes) "
          f"and {sum(w for _, w, _ in busy) / blocks * 1000:.1f} ms wall per block computed (means) "
          f"({statistics.median(n for n, _, _ in busy):.0f} blocks a run at most); a run with nothing to compute "
          f"{statistics.median(c for _, c in idle) * 1000:.0f} ms CPU, "
          f"{statistics.median(w for w, _ in idle) * 1000:.0f} ms wall")
    print(f"  GET occupancy (6h)       : median {ms(occ):.0f} ms, {tail(occ)}; {cpu_text('occupancy')}")
    cpu_total = lambda series: sum(cpu_mean(series))  # noqa: E731
    print(f"  baseline: count rows SQL : median {ms(base):.0f} ms; {cpu_text('floor')}  -> heatmap = "
          f"{statistics.median(heat) / statistics.median(base):.1f}x the bare scan by wall time, "
          f"{cpu_total('heatmap') / cpu_total('floor'):.1f}x by CPU")
    redis_server.stop()


if __name__ == "__main__":
    main()
