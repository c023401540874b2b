"""The full scheduling loop against a real database and Redis (not just the pure core).

    python bench/scheduling_loop.py --nodes 256 --pending 10000 --running 1500 --tenants 20

Fills a throw-away database (PostgreSQL when one answers on 127.0.0.1:5432) with nodes, tenants,
running jobs with allocations and pending jobs, marks the nodes alive in a private Redis, then
times ``run_scheduling_cycle()``: the first cycle (which places everything that fits) and then
steady-state cycles (nothing new arrives; the loop still snapshots, decides and stores reasons).
In the same process it times the pure core on the same snapshot, so the ratio shows what the
database and Redis round trips cost. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import setup  # noqa: E402

GPUS_PER_NODE = 8


def populate(rng: random.Random, nodes: int, tenants: int, running: int, pending: int) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.choices import JobClass, JobState
    from jobs.models import Allocation, Job, Tenant
    from monitoring.models import Gpu, Node

    now = timezone.now()
    node_rows = Node.objects.bulk_create([Node(name=f"node{i:04d}", registered_at=now, rack=f"rack{i // 32}")
                                          for i in range(nodes)])
    gpus = Gpu.objects.bulk_create([
        Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="A100-80GB", memory_mib=81920)
        for node in node_rows for i in range(GPUS_PER_NODE)
    ])
    total = len(gpus)
    tenant_rows = Tenant.objects.bulk_create([
        Tenant(slug=f"t{i:03d}", name=f"Tenant {i}", guaranteed_gpus=int(0.7 * total / tenants),
               max_gpus=int(1.5 * total / tenants), weight=rng.choice([1.0, 1.0, 2.0]))
        for i in range(tenants)
    ])
    owner = get_user_model().objects.create_user("bench")
    running_jobs = Job.objects.bulk_create([
        Job(tenant=rng.choice(tenant_rows), owner=owner, name=f"r{i}", command=["true"], gpus=1,
            state=JobState.RUNNING, run_class=JobClass.GUARANTEED, gpu_memory_mib=20000, placed_at=now,
            started_at=now)
        for i in range(min(running, total))
    ])
    Allocation.objects.bulk_create([Allocation(job=job, gpu=gpu) for job, gpu in zip(running_jobs, gpus)])
    shapes = [(1, 1000), (1, 500), (1, 250), (2, 1000), (4, 1000), (8, 1000)]
    Job.objects.bulk_create([
        Job(tenant=rng.choice(tenant_rows), owner=owner, name=f"p{i}", command=["true"],
            gpus=(shape := rng.choice(shapes))[0], gpu_milli=shape[1],
            gpu_memory_mib=rng.choice([8000, 16000, 30000]), priority=rng.randint(-2, 2),
            max_runtime_s=rng.choice([None, 3600, 7200]))
        for i in range(pending)
    ], batch_size=2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--running", type=int, default=1500)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    args = parser.parse_args()

    db_label, redis_server = setup(args.database)
    import redis

    from agents.protocol import heartbeat_key
    from jobs.scheduling import decide
    from jobs.services.config import scheduler_config
    from jobs.services.cycle import run_scheduling_cycle
    from jobs.services.snapshot import build_snapshot

    populate(random.Random(7), args.nodes, args.tenants, args.running, args.pending)
    client = redis.Redis.from_url(redis_server.url)
    for i in range(args.nodes):
        client.set(heartbeat_key(f"node{i:04d}"), "{}", ex=3600)

    snapshot = build_snapshot(client)
    core_times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        decide(snapshot, now=time.time(), config=scheduler_config())
        core_times.append(time.perf_counter() - started)
    snapshot_times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        build_snapshot(client)
        snapshot_times.append(time.perf_counter() - started)

    first = run_scheduling_cycle()
    steady = [run_scheduling_cycle() for _ in range(args.repeat)]
    steady_median = statistics.median(r.seconds for r in steady)
    core_median = statistics.median(core_times)
    print(f"scheduling loop bench: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.tenants} tenants, "
          f"{args.running} running, {args.pending} pending, {db_label} + Redis")
    print(f"  pure core decide()       : median {core_median * 1000:.0f} ms (same snapshot, {args.repeat} runs)")
    print(f"  snapshot from DB + Redis : median {statistics.median(snapshot_times) * 1000:.0f} ms")
    print(f"  first full cycle         : {first.seconds * 1000:.0f} ms, placed {first.placed} "
          f"({first.placed / first.seconds:,.0f} placements/s), {first.pending} left pending")
    print(f"  steady-state full cycle  : median {steady_median * 1000:.0f} ms over {args.repeat} cycles "
          f"(placed {sum(r.placed for r in steady)})")
    print(f"  full cycle / pure core   : first x{first.seconds / core_median:.2f}, "
          f"steady x{steady_median / core_median:.2f}")
    redis_server.stop()


if __name__ == "__main__":
    main()
