"""A real browser against a live server with the real back end: Celery worker + beat, a metrics
ingest reader and a simulated agent (``browser-node``, 2 x A100) on a private Redis.

Playwright drives Debian's Chromium (``/usr/bin/chromium``); it never downloads a browser. The
tests skip when that binary or the playwright package is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import WORKER_ARGV, Processes, agent_env, agent_secret, database_url, wait_for

CHROMIUM = os.environ.get("COLONY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "var" / "screenshots"
VIEWPORT = {"width": 1440, "height": 900}


@pytest.fixture
def backend(transactional_db, live_redis, live_server, tmp_path, monkeypatch):
    """Worker + beat, ingest and one agent against the live server's database and Redis."""
    from monitoring.models import Node

    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are plain synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "cluster_ui.settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": live_redis,
        "CELERY_BROKER_URL": live_redis,
        "COLONY_VAR_DIR": str(tmp_path / "var"),
        "COLONY_SCHEDULER_INTERVAL": "0.5",
        "COLONY_EVENTS_INTERVAL": "0.2",
        "COLONY_STOP_GRACE_SECONDS": "3",
        "COLONY_AGENT_SECRET": agent_secret(),
        "COLONY_AGENT_AUTH": "required",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    processes = Processes(env, tmp_path)
    processes.start("worker", [*WORKER_ARGV, "-s", str(tmp_path / "beat-schedule")])
    processes.start("ingest", [sys.executable, "manage.py", "ingest", "--block-ms", "200"])
    processes.start("agent", [sys.executable, "-m", "agents", "--node", "browser-node", "--simulate", "2xA100-80GB",
                              "--redis", live_redis, "--interval", "0.5", "--workdir", str(tmp_path / "agent"),
                              "--allow-root-jobs"],  # CI runs as root
                    env=agent_env(env, "browser-node"))
    try:
        wait_for(lambda: Node.objects.filter(name="browser-node").exists(), timeout=30, what="agent registration")
        yield processes
    except BaseException:
        print(processes.logs())
        raise
    finally:
        processes.stop_all()


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists() and not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian package 'chromium')")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            # ORM calls made while Playwright's loop runs get a connection of their own context;
            # left open it keeps the test database from being dropped at the end of the run.
            from django.db import connections

            connections.close_all()
            chromium.close()


@pytest.fixture
def screenshot():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str):
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=False)

    return take
