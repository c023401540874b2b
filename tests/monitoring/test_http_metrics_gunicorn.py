"""Under gunicorn with several workers, as compose runs the web service (cluster_ui/gunicorn_conf.py,
PROMETHEUS_MULTIPROC_DIR), every scrape counts every worker's requests, whichever worker answers
it, and shows each live worker's process series.

Real processes: gunicorn and its workers against the test database and the private Redis.
"""

from __future__ import annotations

import socket
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Processes, stack_environment, wait_for

pytestmark = pytest.mark.e2e

TOKEN = "gunicorn-scrape-s3cret"
WORKERS = 2
REQUESTS = 40


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _counter_pids(directory) -> set[str]:
    return {path.stem.rsplit("_", 1)[1] for path in directory.glob("counter_*.db")}


def _refuses(url: str) -> bool:
    try:
        return _get(url)[0] == 401
    except OSError:
        return False


def test_every_scrape_counts_the_requests_of_every_worker(transactional_db, live_redis, tmp_path):
    port = _free_port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    (multiproc / "counter_999999.db").write_bytes(b"stale")  # a file of an earlier run: cleared at start
    env = stack_environment(live_redis, tmp_path, COLONY_METRICS_TOKEN=TOKEN, COLONY_HTTPS="0",
                            PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    processes = Processes(env, tmp_path)
    # The command compose's web service runs, on a port of the test's own.
    processes.start("gunicorn", [sys.executable, "-m", "gunicorn", "cluster_ui.wsgi:application",
                                 "--config", "python:cluster_ui.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
                                 "--workers", str(WORKERS)])
    base = f"http://127.0.0.1:{port}"
    try:
        # Probed on the metrics view, refused without a token: a probe that timed out here while the
        # server still answered it must not count as a login page served.
        wait_for(lambda: _refuses(f"{base}/metrics"), timeout=30, what="gunicorn to serve")
        assert not (multiproc / "counter_999999.db").exists()
        # Bursts until every worker has answered some (whichever accepts a connection answers it:
        # the kernel spreads them, a loaded machine unevenly). A worker's first answer makes its
        # counter file in the multiprocess directory, named by its pid.
        sent = 0
        deadline = time.monotonic() + 60
        while not sent or len(_counter_pids(multiproc)) < WORKERS and time.monotonic() < deadline:
            with ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(lambda _: _get(f"{base}/accounts/login/")[0], range(REQUESTS)))
            sent += REQUESTS
            assert statuses == [200] * REQUESTS
        assert len(_counter_pids(multiproc)) == WORKERS, _counter_pids(multiproc)
        # As many slow clients (headers unfinished) as there are workers: others are still served,
        # and the slow ones answered once they finish.
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(WORKERS)]
        for connection in held:
            connection.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        time.sleep(0.5)
        assert [_get(f"{base}/accounts/login/")[0] for _ in range(WORKERS * 2)] == [200] * WORKERS * 2
        for connection in held:
            connection.sendall(b"Connection: close\r\n\r\n")
            assert connection.makefile("rb").readline().split()[1] == b"200"
            connection.close()
        sent += WORKERS * 3

        pids_seen = set()
        for _ in range(6):  # several scrapes, answered by whichever worker accepts each
            status, body = _get(f"{base}/metrics", TOKEN)
            assert status == 200, body[:300]
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            responses = families["django_http_responses_total_by_status_view_method"].samples
            logins = {s.labels["status"]: s.value for s in responses
                      if s.labels["view"] == "login" and s.labels["method"] == "GET"}
            # Every login page served, summed over the workers, every scrape.
            assert logins == {"200": sent}
            assert "401" in {s.labels["status"] for s in responses if s.labels["view"] == "prometheus-metrics"}
            pids_seen |= {s.labels["pid"] for s in families["process_resident_memory_bytes"].samples}
            # Cluster series still come with them.
            assert "colony_nodes" in families and "colony_jobs" in families
        assert len(pids_seen) == WORKERS, pids_seen
    except BaseException:
        print(processes.logs())
        raise
    finally:
        processes.stop_all()

