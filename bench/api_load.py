"""API and page latency with a long queue, and a submission burst.

    python bench/api_load.py --queued 10000 --users 50 --burst 1000

Fills a throw-away database (PostgreSQL when one answers) with ``--queued`` pending jobs across
tenants, then, through Django's test client (the full middleware, auth and DRF stack, no
network): the jobs list API (first and a deep page), the queue API, the queue page, as p50/p95
over repeated requests; then ``--burst`` submissions spread over ``--users`` users with the
production throttle on, counting 201s and clean 429s (with Retry-After). Baseline in the same
run: a bare ``SELECT count(*)`` of the pending jobs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import setup  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rate", default="120/min", help="per-user submission rate (COLONY_SUBMIT_RATE)")
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    args = parser.parse_args()
    import os

    os.environ["COLONY_SUBMIT_RATE"] = args.rate
    db_label, redis_server = setup(args.database)

    os.environ["REDIS_URL"] = redis_server.url
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.test import APIClient

    from jobs.models import Job, Membership, Tenant

    settings.REDIS_URL = redis_server.url
    from cluster_ui.celery import app

    app.conf.broker_url = redis_server.url
    User = get_user_model()
    tenants = Tenant.objects.bulk_create([Tenant(slug=f"t{i}", name=f"T{i}", guaranteed_gpus=8, max_gpus=16)
                                          for i in range(10)])
    users = [User.objects.create_user(f"u{i}", password="x") for i in range(args.users)]
    Membership.objects.bulk_create([Membership(user=u, tenant=tenants[i % len(tenants)]) for i, u in enumerate(users)])
    Job.objects.bulk_create([
        Job(tenant=tenants[i % len(tenants)], owner=users[i % len(users)], name=f"j{i}", command=["true"], gpus=1,
            pending_reason={"code": "waiting_for_free_gpus", "message": "Waiting for 1 free GPU", "details": {}})
        for i in range(args.queued)
    ], batch_size=2000)

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
    results = {}
    for label, fn in rows:
        fn()  # warm
        results[label] = timed(fn, args.repeat)
        print(f"  {label:32s}: {percentiles(results[label])}")
    base = statistics.median(results["baseline: SELECT count(*)"])
    print(f"  jobs list page 1 / baseline     : {statistics.median(results['GET /api/v1/jobs/ (page 1)']) / base:.1f}x")

    accepted = throttled = other = 0
    retry_after_ok = True
    clients = []
    for user in users:
        client = APIClient()
        client.force_authenticate(user)
        clients.append(client)
    started = time.perf_counter()
    for n in range(args.burst):
        response = clients[n % len(clients)].post(
            "/api/v1/jobs/", {"command": ["python", "-c", "pass"], "gpus": 1}, format="json")
        if response.status_code == 201:
            accepted += 1
        elif response.status_code == 429:
            throttled += 1
            retry_after_ok &= response.has_header("Retry-After")
        else:
            other += 1
    elapsed = time.perf_counter() - started
    print(f"  burst: {args.burst} submissions from {args.users} users (rate {args.rate} each) in {elapsed:.1f} s "
          f"({args.burst / elapsed:,.0f}/s): {accepted} accepted, {throttled} throttled "
          f"(Retry-After on all: {retry_after_ok}), {other} other")
    redis_server.stop()


if __name__ == "__main__":
    main()
