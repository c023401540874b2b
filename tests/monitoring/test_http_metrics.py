"""/metrics carries the web server's own series: requests by view name, method and status
(django-prometheus's middleware, in settings.MIDDLEWARE), their latency, and the process's CPU,
memory and file descriptors; scraped with the metrics token as Prometheus would.

The counters live in this test process's default registry and grow across tests, so each test
reads how much they moved between two scrapes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from monitoring.metrics import WorkerProcessCollector
from tests.factories import UserFactory

TOKEN = "scrape-s3cret"
RESPONSES = "django_http_responses_total_by_status_view_method_total"
LATENCY = "django_http_requests_latency_seconds_by_view_method"


@pytest.fixture
def scrape(client, db, live_redis, settings):
    """Scrape /metrics with the bearer token: {(sample name, frozenset(labels)): value}."""
    settings.COLONY_METRICS_TOKEN = TOKEN

    def read() -> dict:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200, response.content[:200]
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}

    return read


def moved(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_requests_are_counted_by_view_name_method_and_status(client, scrape):
    before = scrape()
    for _ in range(3):
        assert client.get("/accounts/login/").status_code == 200
    assert client.get("/nodes/").status_code == 302  # signed out: sent to the login page
    after = scrape()
    assert moved(before, after, RESPONSES, status="200", view="login", method="GET") == 3
    assert moved(before, after, RESPONSES, status="302", view="nodes", method="GET") == 1
    # The latency histogram has the same view label; each request lands in the +Inf bucket.
    assert moved(before, after, f"{LATENCY}_count", view="login", method="GET") == 3
    assert moved(before, after, f"{LATENCY}_bucket", view="login", method="GET", le="+Inf") == 3


def test_a_view_that_raises_is_counted_as_a_500_of_that_view(scrape, monkeypatch):
    """What the 5xx alert and panel read: a view that fails is a 500 under its own view name."""
    import monitoring.views

    def broken(*args, **kwargs):
        raise RuntimeError("template backend down")

    monkeypatch.setattr(monitoring.views, "render", broken)
    browser = Client(raise_request_exception=False)
    browser.force_login(UserFactory())
    before = scrape()
    assert browser.get("/heatmap/").status_code == 500
    after = scrape()
    assert moved(before, after, RESPONSES, status="500", view="heatmap", method="GET") == 1
    assert moved(before, after, "django_http_exceptions_total_by_view_total", view="heatmap") == 1
    assert moved(before, after, "django_http_exceptions_total_by_type_total", type="RuntimeError") == 1


def test_paths_no_view_matched_share_one_label(client, scrape):
    """Label values come from the URL patterns' names, never from the path: a scanner walking
    random URLs adds no series."""
    before = scrape()
    for n in range(5):
        assert client.get(f"/no/such/page/{n}/").status_code == 404
    after = scrape()
    assert moved(before, after, RESPONSES, status="404", view="<unnamed view>", method="GET") == 5
    assert not [key for key in after if any("/no/such/page" in value for _, value in key[1])]


def test_unauthorised_scrapes_are_refused_and_counted(client, scrape):
    before = scrape()
    assert client.get("/metrics").status_code == 401
    after = scrape()
    assert moved(before, after, RESPONSES, status="401", view="prometheus-metrics", method="GET") == 1


def test_process_series_are_exported(scrape):
    samples = {name for name, _ in scrape()}
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_max_fds", "process_start_time_seconds"):
        assert name in samples


def test_worker_process_series_cover_live_writers_only(tmp_path):
    """Under gunicorn (multiprocess mode) each live worker's process series, labelled with its pid;
    a worker that died leaves its counter files but no process series."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        for pid in (child.pid, dead.pid):
            (tmp_path / f"counter_{pid}.db").write_bytes(b"")
        (tmp_path / f"histogram_{child.pid}.db").write_bytes(b"")
        families = {f.name: f for f in WorkerProcessCollector(str(tmp_path)).collect()}
        rss = {s.labels["pid"]: s.value for s in families["process_resident_memory_bytes"].samples}
        assert set(rss) == {str(os.getpid()), str(child.pid)}
        assert all(value > 0 for value in rss.values())
        fds = {s.labels["pid"] for s in families["process_open_fds"].samples}
        assert fds == set(rss)
        assert families["process_cpu_seconds"].type == "counter"
    finally:
        child.kill()
        child.wait()


def test_compose_runs_the_web_server_as_the_gunicorn_test_does():
    """test_http_metrics_gunicorn.py starts gunicorn with this config; compose's web service must
    run the same, or its scrapes count one worker's share."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    web = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["web"]
    command = web["command"]
    assert command[:2] == ["gunicorn", "cluster_ui.wsgi:application"]
    assert command[command.index("--config") + 1] == "python:cluster_ui.gunicorn_conf"
    assert (root / "cluster_ui" / "gunicorn_conf.py").is_file()
    assert int(command[command.index("--workers") + 1]) > 1
