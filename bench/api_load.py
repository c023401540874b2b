"""API and page latency with a long queue; submission throughput against a plain DRF view.

    python bench/api_load.py --queued 10000 --users 50 --burst 1000

Fills a throw-away database (PostgreSQL when one answers: ``$COLONY_BENCH_DB``, else
``colony_bench_api_<pid>``, dropped at exit, so that it can run beside other benches) with
``--queued`` pending jobs across tenants, then, through Django's test client (the full
middleware, auth and DRF stack, no network):

1. the jobs list API (first and a deep page), the queue API, the queue page: p50/p95;
2. single submissions (``POST /api/v1/jobs/``) against the baseline, a plain DRF ``CreateAPIView``
   with a ``ModelSerializer`` that inserts one Job row (same DB, same middleware), in alternating
   blocks of ``--block`` requests, at a small inventory (3 nodes x 8 GPUs) and at ``--big-nodes`` x 8
   GPUs (16,384 by default). Each block is measured in wall time and CPU seconds: this process's
   ``process_time`` plus the PostgreSQL backend's and Redis's utime+stime from ``/proc``, because
   wall time moves several-fold between identical runs on a shared 2-core machine. The ratio is
   taken per pair of adjacent blocks and its median printed;
3. bulk submissions (``POST /api/v1/jobs/bulk/``, ``--bulk-size`` jobs each) at the big inventory:
   jobs/s by wall and by CPU;
4. a burst of ``--burst`` submissions over ``--users`` users with the production throttle on,
   counting 201s and clean 429s (with Retry-After).

``--only single`` (repeatable; ``reads``, ``single``, ``bulk``, ``burst``) runs only those parts;
``--profile N`` first profiles N submissions and N plain creates by CPU time (cProfile) at each
inventory and prints the statements one request runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import backend_pid, proc_cpu, setup  # noqa: E402

DATABASE = "colony_bench_api"
JOB = {"command": ["python", "-c", "pass"], "gpus": 1}


@dataclass
class Block:
    """One block of requests: wall and CPU seconds (this process, the DB backend, Redis)."""

    count: int
    wall: float
    python: float
    database: float
    redis: float

    @property
    def cpu(self) -> float:
        return self.python + self.database + self.redis


class Meter:
    def __init__(self, redis_pid: int | None):
        self.redis_pid = redis_pid

    def measure(self, fn, count: int) -> Block:
        backend = backend_pid()
        before = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(self.redis_pid))
        fn()
        after = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(self.redis_pid))
        if backend != backend_pid():
            print("  (warning: the database connection changed during a block; its CPU is not counted)")
        return Block(count, *(b - a for a, b in zip(before, after)))


def percentiles(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:6.0f} ms   p95 {p95 * 1000:6.0f} ms"


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def install_baseline_views() -> tuple[str, str]:
    """Mount the baselines beside the project's URLs, plain DRF create views of the Job model:
    one with a 7-field ModelSerializer, one with every field of the model (``__all__``, what a
    plain view of the same resource answers). Returns their paths."""
    import types

    from django.conf import settings
    from django.urls import clear_url_caches, include, path
    from rest_framework import generics, serializers

    from jobs.models import Job

    class PlainJobSerializer(serializers.ModelSerializer):
        class Meta:
            model = Job
            fields = ["id", "name", "command", "gpus", "tenant", "state", "submitted_at"]
            read_only_fields = ["id", "state", "submitted_at"]

    class FullJobSerializer(serializers.ModelSerializer):
        class Meta:
            model = Job
            fields = "__all__"
            read_only_fields = ["owner"]

    class PlainCreate(generics.CreateAPIView):
        serializer_class = PlainJobSerializer
        queryset = Job.objects.all()

        def perform_create(self, serializer):
            serializer.save(owner=self.request.user)

    class FullCreate(PlainCreate):
        serializer_class = FullJobSerializer

    urls = types.ModuleType("bench_api_load_urls")
    urls.urlpatterns = [path("bench/plain-create/", PlainCreate.as_view()),
                        path("bench/plain-full-create/", FullCreate.as_view()),
                        path("", include(settings.ROOT_URLCONF))]
    sys.modules[urls.__name__] = urls
    settings.ROOT_URLCONF = urls.__name__
    clear_url_caches()
    return "/bench/plain-create/", "/bench/plain-full-create/"


def make_inventory(nodes: int, gpus_per_node: int = 8) -> None:
    """Replace the inventory with ``nodes`` online nodes of ``gpus_per_node`` A100s each."""
    from django.utils import timezone

    from monitoring.models import Gpu, Node
    from monitoring.services import registry

    Gpu.objects.all().delete()
    Node.objects.all().delete()
    now = timezone.now()
    made = Node.objects.bulk_create([Node(name=f"n{i:05d}", registered_at=now) for i in range(nodes)], batch_size=2000)
    Gpu.objects.bulk_create([Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="A100-80GB", memory_mib=81920)
                             for node in made for i in range(gpus_per_node)], batch_size=5000)
    # Bulk inserts send no signals: say it as a writer of the inventory must.
    changed = getattr(registry, "inventory_changed", None)
    if changed:
        changed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7, help="pairs of blocks (baseline, submit) per inventory")
    parser.add_argument("--block", type=int, default=40, help="requests per block")
    parser.add_argument("--big-nodes", type=int, default=2048, help="nodes of 8 GPUs in the big inventory")
    parser.add_argument("--bulk-size", type=int, default=1000)
    parser.add_argument("--bulk-rounds", type=int, default=5)
    parser.add_argument("--rate", default="120/min", help="per-user submission rate (COLONY_SUBMIT_RATE)")
    parser.add_argument("--bulk-rate", default="100000/min", help="per-user rate while bulk submissions run")
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    parser.add_argument("--only", choices=["reads", "single", "bulk", "burst"], action="append",
                        help="run only these parts (repeatable); all by default")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="before the single-submission blocks, profile N submissions and N plain (all fields) "
                             "creates at each inventory with cProfile and print their queries")
    parser.add_argument("--profile-lines", type=int, default=45)
    args = parser.parse_args()
    parts = set(args.only or ["reads", "single", "bulk", "burst"])

    os.environ["COLONY_SUBMIT_RATE"] = args.rate
    db_label, redis_server = setup(args.database, DATABASE)

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.settings import api_settings
    from rest_framework.test import APIClient

    from jobs.models import Job, JobWait, Membership, Tenant

    settings.REDIS_URL = redis_server.url
    from cluster_ui.celery import app

    app.conf.broker_url = redis_server.url
    User = get_user_model()
    tenants = Tenant.objects.bulk_create([Tenant(slug=f"t{i}", name=f"T{i}", guaranteed_gpus=8, max_gpus=16)
                                          for i in range(10)])
    users = [User.objects.create_user(f"u{i}", password="x") for i in range(args.users)]
    Membership.objects.bulk_create([Membership(user=u, tenant=tenants[i % len(tenants)]) for i, u in enumerate(users)])
    queued = Job.objects.bulk_create([
        Job(tenant=tenants[i % len(tenants)], owner=users[i % len(users)], name=f"j{i}", command=["true"], gpus=1)
        for i in range(args.queued)
    ], batch_size=2000)
    JobWait.objects.bulk_create([
        JobWait(job=job, reason={"code": "waiting_for_free_gpus", "message": "Waiting for 1 free GPU", "details": {}})
        for job in queued], batch_size=2000)
    make_inventory(3)
    from django.db import connection

    if connection.vendor == "postgresql":
        # As autovacuum would within a minute of the load, before the bench is over: without table
        # statistics the planner counts a user's waiting jobs through every PENDING row's index entry.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")

    api = APIClient()
    api.force_authenticate(users[0])
    page = Client()
    page.force_login(users[0])
    mine = Job.objects.filter(tenant=tenants[0]).count()
    last_page = max(1, (mine + 49) // 50)

    def get(client, url, **params):
        response = client.get(url, params)
        assert response.status_code == 200, (url, response.status_code)

    from django.db import connection

    def floor():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobs_job WHERE state = 'PENDING'")
            cursor.fetchone()

    rows = [
        ("GET /api/v1/jobs/ (page 1)", lambda: get(api, "/api/v1/jobs/")),
        (f"GET /api/v1/jobs/?page={last_page}", lambda: get(api, "/api/v1/jobs/", page=last_page)),
        ("GET /api/v1/queue/", lambda: get(api, "/api/v1/queue/")),
        ("GET /jobs/ (queue page)", lambda: get(page, "/jobs/")),
        ("baseline: SELECT count(*)", floor),
    ]
    print(f"api load bench: {args.queued:,} queued jobs in {len(tenants)} tenants ({mine:,} visible to the "
          f"user), {db_label}, {args.repeat} requests each")
    if "reads" in parts:
        results = {}
        for label, fn in rows:
            fn()  # warm
            results[label] = timed(fn, args.repeat)
            print(f"  {label:32s}: {percentiles(results[label])}")
        base = statistics.median(results["baseline: SELECT count(*)"])
        print(f"  jobs list page 1 / baseline     : "
              f"{statistics.median(results['GET /api/v1/jobs/ (page 1)']) / base:.1f}x")

    clients = []
    for user in users:
        client = APIClient()
        client.force_authenticate(user)
        clients.append(client)
    plain_url, full_url = install_baseline_views()
    meter = Meter(redis_pid=getattr(getattr(redis_server, "process", None), "pid", None))
    turn = iter(range(10 ** 9))

    def post_block(url, body_of, count: int, expect: int = 201):
        def run():
            for _ in range(count):
                n = next(turn)
                response = clients[n % len(clients)].post(url, body_of(n), format="json")
                assert response.status_code == expect, (url, response.status_code, response.content[:300])
        return run

    def plain_body(n):
        return {**JOB, "name": "python", "tenant": tenants[(n % len(clients)) % len(tenants)].pk}

    def submit_body(n):
        return JOB

    def per_request(block: Block) -> str:
        return (f"{block.count / block.wall:6.0f}/s wall, {block.cpu / block.count * 1000:5.2f} ms CPU/request "
                f"(python {block.python / block.count * 1000:.2f} + db {block.database / block.count * 1000:.2f} + "
                f"redis {block.redis / block.count * 1000:.2f})")

    def median_block(blocks: list[Block]) -> Block:
        return Block(blocks[0].count, *(statistics.median(getattr(b, f) for b in blocks)
                                        for f in ("wall", "python", "database", "redis")))

    def profile(nodes: int) -> None:
        import cProfile
        import pstats

        from django.test.utils import CaptureQueriesContext

        for label, url, body_of in (("submit", "/api/v1/jobs/", submit_body),
                                    ("plain (all fields)", full_url, plain_body)):
            with CaptureQueriesContext(connection) as queries:
                post_block(url, body_of, 1)()
            print(f"  profile, {nodes * 8:,} GPUs, {label}: {len(queries)} queries a request")
            for query in queries:
                print(f"    {query['sql'][:160]}")
            profiler = cProfile.Profile(time.process_time)  # CPU, not time waiting on the database
            profiler.runcall(post_block(url, body_of, args.profile))
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("cumulative").print_stats(args.profile_lines)
            stats.sort_stats("tottime").print_stats(args.profile_lines)

    if "single" in parts:
        print(f"single submissions vs plain DRF create views (7 fields; all fields): {args.rounds} rounds of blocks "
              f"of {args.block} requests, medians; ratio = submit rate / plain rate, per round")
    for nodes in (3, args.big_nodes) if "single" in parts else ():
        make_inventory(nodes)
        post_block("/api/v1/jobs/", submit_body, 3)()  # warm: first inventory read, connections
        post_block(plain_url, plain_body, 3)()
        post_block(full_url, plain_body, 3)()
        if args.profile:
            profile(nodes)
        plain, full, submit = [], [], []
        for _ in range(args.rounds):
            plain.append(meter.measure(post_block(plain_url, plain_body, args.block), args.block))
            full.append(meter.measure(post_block(full_url, plain_body, args.block), args.block))
            submit.append(meter.measure(post_block("/api/v1/jobs/", submit_body, args.block), args.block))
        label = f"  inventory {nodes * 8:6,} GPUs:"
        print(f"{label} plain (7 fields)   {per_request(median_block(plain))}")
        print(f"{label} plain (all fields) {per_request(median_block(full))}")
        print(f"{label} submit             {per_request(median_block(submit))}")
        for name, base in (("plain (7 fields)", plain), ("plain (all fields)", full)):
            wall_ratio = statistics.median(p.wall / s.wall for p, s in zip(base, submit))
            cpu_ratio = statistics.median(p.cpu / s.cpu for p, s in zip(base, submit))
            print(f"{label} submit / {name:18s} = {wall_ratio:.2f}x by wall, {cpu_ratio:.2f}x by CPU")

    if "single" not in parts:
        make_inventory(args.big_nodes)
    api_settings.DEFAULT_THROTTLE_RATES["submit"] = args.bulk_rate
    bulk_body = {"jobs": [JOB] * args.bulk_size}
    probe = clients[0].post("/api/v1/jobs/bulk/", {"jobs": [JOB]}, format="json") if "bulk" in parts else None
    if probe is None:
        pass
    elif probe.status_code != 201:
        print(f"  bulk: POST /api/v1/jobs/bulk/ answers {probe.status_code}; not measured")
    else:
        blocks = [meter.measure(post_block("/api/v1/jobs/bulk/", lambda n: bulk_body, 1), args.bulk_size)
                  for _ in range(args.bulk_rounds)]
        block = median_block(blocks)
        print(f"  bulk ({args.bulk_size} jobs a request, {args.big_nodes * 8:,} GPUs, {args.bulk_rounds} requests, "
              f"median): {block.count / block.wall:,.0f} jobs/s wall, {block.count / block.cpu:,.0f} jobs/s CPU "
              f"({block.cpu / block.count * 1000:.3f} ms CPU/job: python {block.python / block.count * 1000:.3f} + "
              f"db {block.database / block.count * 1000:.3f} + redis {block.redis / block.count * 1000:.3f})")
    api_settings.DEFAULT_THROTTLE_RATES["submit"] = args.rate
    from django.core.cache import cache

    cache.clear()  # the throttle histories of the blocks above

    if "burst" not in parts:
        redis_server.stop()
        return
    accepted = throttled = other = 0
    retry_after_ok = True
    started, cpu_started = time.perf_counter(), time.process_time()
    for n in range(args.burst):
        response = clients[n % len(clients)].post("/api/v1/jobs/", JOB, format="json")
        if response.status_code == 201:
            accepted += 1
        elif response.status_code == 429:
            throttled += 1
            retry_after_ok &= response.has_header("Retry-After")
        else:
            other += 1
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    print(f"  burst ({args.big_nodes * 8:,} GPUs): {args.burst} submissions from {args.users} users (rate {args.rate} "
          f"each) in {elapsed:.1f} s "
          f"({args.burst / elapsed:,.0f}/s; {cpu:.1f} s python CPU): {accepted} accepted, {throttled} throttled "
          f"(Retry-After on all: {retry_after_ok}), {other} other")
    redis_server.stop()


if __name__ == "__main__":
    main()
