"""The beat's periodic tasks against a real database and Redis, at cluster scale.

    python bench/periodic.py --nodes 1024 --repeat 7

Fills a throw-away database (PostgreSQL when one answers on 127.0.0.1:5432: ``$COLONY_BENCH_DB``,
else ``colony_bench_periodic_<pid>``, dropped at exit) with ``--nodes`` nodes x 8 GPUs and a
running job on ``--running`` of the GPUs (all by default), each job with its peak memory recorded.
A private Redis holds every node's heartbeat and its latest live sample, which lists the node's
jobs, their attempts and duty cycles, as an agent's does. ``--rollup-minutes`` also writes that many
minutes of 10 s GPU rollups (none by default: a fresh database, as the issue measured it).

Then each task's steady call, through its Celery task entry point, ``--repeat`` times with
heartbeats and samples refreshed before each (outside the measurement):

- ``check_node_health`` (every 2 s): every node heard from, nothing lost, stray or vanished;
- ``evaluate_alerts`` (every 30 s): nothing idle, over its request or hot;
- ``warm_heatmap`` (every minute): after the runs that fill the settled blocks (apart, as
  "first"), the call that finds them all cached.

Each is measured in CPU seconds (this process's ``process_time``, the PostgreSQL backend's and
Redis's utime+stime from ``/proc``) beside wall time, with the SQL queries it made
(``CaptureQueriesContext``) and the Redis commands Redis counted. The baseline is
``bench/scheduler.py``'s ``reference_loop_ms`` (a fixed 1M-iteration pure-Python loop): issue 39
sets the steady scheduling cycle at most 2x that every 2 s, and the periodic tasks together at most
10% of the scheduling loop's CPU, so the last line is their CPU per second against that.
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import backend_pid, proc_cpu, setup  # noqa: E402

GPUS_PER_NODE = 8
DATABASE = "colony_bench_periodic"
# The steady scheduling cycle's target in issue 39: twice the reference loop, every 2 s.
CYCLE_TARGET_REFERENCES = 2.0


@dataclass
class Sample:
    wall: float
    python: float
    database: float
    redis: float
    queries: int
    redis_commands: int
    collector: float = 0.0  # of ``python``: this process's garbage collector

    @property
    def cpu(self) -> float:
        return self.python + self.database + self.redis


_collecting: list[float] = []
_collected = [0.0]


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _collecting.append(time.process_time())
    elif _collecting:
        _collected[0] += time.process_time() - _collecting.pop()


gc.callbacks.append(_on_collection)


def measure(fn, redis_client, redis_pid: int | None) -> tuple[Sample, object]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    gc.collect()  # (what came before is not the call's garbage)
    connection.queries_log.clear()  # (a full log, 9,000 queries, would count none)
    collected = _collected[0]
    backend = backend_pid()
    commands = redis_client.info("stats")["total_commands_processed"]
    before = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(redis_pid))
    with CaptureQueriesContext(connection) as queries:
        result = fn()
    after = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(redis_pid))
    # (the INFO above is counted once it has run; the one below is not yet)
    issued = redis_client.info("stats")["total_commands_processed"] - commands - 1
    return Sample(*(b - a for a, b in zip(before, after)), queries=len(queries), redis_commands=issued,
                  collector=_collected[0] - collected), result


def median(samples: list[Sample]) -> Sample:
    return Sample(*(statistics.median(getattr(s, f) for s in samples)
                    for f in ("wall", "python", "database", "redis", "queries", "redis_commands", "collector")))


def populate(nodes: int, running: int, rollup_minutes: int) -> None:
    import random

    from django.utils import timezone

    from bench.scheduling_loop import populate as populate_loop
    from jobs.models import Job
    from monitoring.choices import Resolution
    from monitoring.models import Gpu, GpuRollup, JobUsage, Node

    # The scheduling loop bench's cluster (its module may write running jobs' states, as their
    # agents' reports would), with nothing pending.
    populate_loop(random.Random(7), nodes, 1, running, 0)
    now = timezone.now()
    # Registered and started long enough ago to be judged (registration grace, start reconcile).
    earlier = now - timedelta(minutes=10)
    Node.objects.update(registered_at=earlier)
    Job.objects.update(placed_at=earlier, started_at=earlier)
    # Under their request: no memory alert.
    JobUsage.objects.bulk_create([JobUsage(job_id=pk, peak_gpu_memory_mib=18000, util_sum=50.0, util_n=1,
                                           first_seen_at=earlier, last_seen_at=now)
                                  for pk in Job.objects.values_list("pk", flat=True)], batch_size=4000)
    if rollup_minutes:
        gpus = list(Gpu.objects.all())
        start = int(now.timestamp()) // 10 * 10 - rollup_minutes * 60
        for minute in range(rollup_minutes):
            # Busy GPUs (no idle alert), every 10 s bucket of the minute.
            GpuRollup.objects.bulk_create([
                GpuRollup(gpu=gpu, resolution=Resolution.TEN_SECONDS,
                          bucket_start=datetime.fromtimestamp(start + minute * 60 + s * 10, tz=dt_timezone.utc),
                          samples=10, util_sum=600.0, util_n=10, util_max=70.0, mem_sum=10 * 20000.0, mem_n=10,
                          mem_max=20000, temp_max=60.0)
                for gpu in gpus for s in range(6)
            ], batch_size=5000)


def node_samples(nodes: int) -> list:
    """What each node's agent last sent: its GPUs, its jobs, their attempts and duty cycles."""
    from agents.protocol import GpuSample, JobGpuSample, NodeSample
    from jobs.models import Allocation
    from jobs.services.commands import launch_id

    by_node: dict[str, list[tuple[int, int, int]]] = {}
    for job_id, attempt, node, index in Allocation.objects.filter(released_at__isnull=True).values_list(
            "job_id", "job__attempt", "gpu__node__name", "gpu__index"):
        by_node.setdefault(node, []).append((job_id, attempt, index))
    now, samples = time.time(), []
    for i in range(nodes):
        name = f"node{i:04d}"
        held = sorted(by_node.get(name, []))
        gpus = [GpuSample(index=index, util_sm=70.0, mem_used_mib=20000, mem_total_mib=81920, temperature_c=60.0,
                          power_w=300.0) for index in range(GPUS_PER_NODE)]
        jobs = [JobGpuSample(job_id=job_id, gpu_index=index, mem_used_mib=18000, util_sm=70.0)
                for job_id, _, index in held]
        samples.append(NodeSample(node=name, ts=now, seq=1, gpus=gpus, jobs=jobs,
                                  running_jobs=[job_id for job_id, _, _ in held],
                                  running_launches=[launch_id(job_id, attempt) for job_id, attempt, _ in held],
                                  duty_cycles=[1.0] * len(held)))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--running", type=int, default=None, help="running jobs, one GPU each (default: every GPU)")
    parser.add_argument("--rollup-minutes", type=int, default=0, help="minutes of 10 s GPU rollups to write")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    parser.add_argument("--profile", choices=["health", "alerts", "heatmap"],
                        help="after the measurements, profile one call of that task (cProfile, own time)")
    args = parser.parse_args()
    running = args.nodes * GPUS_PER_NODE if args.running is None else args.running

    db_label, redis_server = setup(args.database, DATABASE, redis_cache=True)
    import redis

    from agents.protocol import heartbeat_key
    from bench.scheduler import reference_loop_ms
    from jobs.tasks import check_node_health, evaluate_alerts
    from monitoring.services import live
    from monitoring.services.health import MAX_HEARTBEAT_TTL_S, REDIS_SEEN_SINCE_KEY
    from monitoring.tasks import warm_heatmap

    populate(args.nodes, running, args.rollup_minutes)
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # (as autovacuum would within a minute of the load)
    client = redis.Redis.from_url(redis_server.url)
    redis_pid = getattr(getattr(redis_server, "process", None), "pid", None)
    # This Redis has been up for a while: nodes are judged (not the grace after a Redis restart).
    client.set(REDIS_SEEN_SINCE_KEY, time.time() - 3600)

    def agents() -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(args.nodes):
            pipe.set(heartbeat_key(f"node{i:04d}"), "{}", ex=MAX_HEARTBEAT_TTL_S)
        pipe.execute()
        live.store_latest(client, node_samples(args.nodes))

    tasks = {"health": ("check_node_health", check_node_health, 2.0),
             "alerts": ("evaluate_alerts", evaluate_alerts, 30.0),
             "heatmap": ("warm_heatmap", warm_heatmap, 60.0)}
    results: dict[str, list[Sample]] = {name: [] for name in tasks}
    first: dict[str, Sample] = {}
    outcomes: dict[str, object] = {}
    # The heatmap's settled blocks are filled over a few runs (two per range and metric a run):
    # those runs are measured apart; the steady call is the one after, that finds them cached.
    agents()
    filling, computed = [], None
    while computed != 0 and len(filling) < 20:
        sample, computed = measure(warm_heatmap, client, redis_pid)
        filling.append(sample)
    first["heatmap"] = filling[0]
    for name in ("health", "alerts"):
        agents()
        first[name], _ = measure(tasks[name][1], client, redis_pid)
    for _ in range(args.repeat):
        for name, (_, task, _) in tasks.items():
            agents()
            sample, outcomes[name] = measure(task, client, redis_pid)
            results[name].append(sample)

    reference_ms = reference_loop_ms()
    print(f"periodic tasks bench: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {running} running jobs, "
          f"{args.rollup_minutes} min of rollups, {db_label} + Redis; medians of {args.repeat}; "
          f"reference loop (1M iterations of pure Python) {reference_ms:.0f} ms")
    per_second = 0.0
    for name, (label, _, period) in tasks.items():
        m = median(results[name])
        per_second += m.cpu / period
        print(f"  {label:<18} every {period:4.0f} s: CPU {m.cpu * 1000:7.1f} ms (Python {m.python * 1000:6.1f} + "
              f"DB {m.database * 1000:6.1f} + Redis {m.redis * 1000:5.1f}; collector {m.collector * 1000:4.1f}) "
              f"x{m.cpu * 1000 / reference_ms:5.2f} reference | wall {m.wall * 1000:7.1f} ms | "
              f"{m.queries:4.0f} queries, {m.redis_commands:5.0f} Redis "
              f"commands | first call {first[name].cpu * 1000:.0f} ms CPU, {first[name].queries} queries")
    print(f"  (warm_heatmap filled the settled blocks in {len(filling) - 1} run(s) before: "
          + ", ".join(f"{s.cpu * 1000:.0f} ms" for s in filling[:-1]) + " CPU)")
    budget = CYCLE_TARGET_REFERENCES * reference_ms / 1000 / 2.0
    print(f"  together {per_second * 1000:.1f} ms CPU per second: {per_second / budget:.1%} of a scheduling loop at "
          f"its steady target ({CYCLE_TARGET_REFERENCES:g}x reference every 2 s = {budget * 1000:.0f} ms per second); "
          f"last outcomes: health {outcomes['health']}, alerts raised {outcomes['alerts']}, "
          f"heatmap blocks computed {outcomes['heatmap']}")
    if args.profile:
        import cProfile
        import pstats

        agents()
        profiler = cProfile.Profile()
        profiler.runcall(tasks[args.profile][1])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    redis_server.stop()


if __name__ == "__main__":
    main()
