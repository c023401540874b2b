"""Real processes for end-to-end tests: a Celery worker with embedded beat and a simulated agent,
against the private Redis and the test database (committed data, so ``transactional_db``).

Agent authentication is on, as in production: the server processes get a random
``COLONY_AGENT_SECRET`` and each agent only its own key (:func:`agent_env`).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from agents import signing

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def agent_secret() -> str:
    return secrets.token_hex(32)


def agent_env(server_env: dict[str, str], node: str) -> dict[str, str]:
    """An agent's environment: the server's without the secret, plus ``node``'s key."""
    env = {name: value for name, value in server_env.items() if name != "COLONY_AGENT_SECRET"}
    env["COLONY_AGENT_KEY"] = signing.node_key(server_env["COLONY_AGENT_SECRET"], node).hex()
    return env


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Processes:
    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir
        self.started: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env=self.env if env is None else env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        log.close()
        self.started.append((name, process))
        return process

    def start_agent(self, node: str, spec: str) -> subprocess.Popen:
        return self.start(f"agent-{node}", [
            sys.executable, "-m", "agents", "--node", node, "--simulate", spec, "--redis", self.env["REDIS_URL"],
            "--interval", "0.2", "--heartbeat-ttl", "1.5", "--workdir", str(self.log_dir / f"agent-{node}"),
            "--allow-root-jobs",  # CI runs as root; accounts are tested in tests/agents/test_runner_sandbox.py
        ], env=agent_env(self.env, node))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))

    def stop_all(self) -> None:
        for _, process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process in reversed(self.started):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


@pytest.fixture
def stack(transactional_db, live_redis, tmp_path, request):
    """Worker + beat + one agent ``e2e-node`` with 2 simulated A100s; yields the Processes."""
    from monitoring.models import Node

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
        # A worker killed holding the scheduler lock blocks others for at most this long.
        "COLONY_SCHEDULER_LOCK_LEASE": "5",
        "COLONY_NODE_REGISTRATION_GRACE_S": "1",
        "COLONY_REDIS_RESTART_GRACE_S": "6",
        "COLONY_AGENT_SECRET": agent_secret(),
        "COLONY_AGENT_AUTH": "required",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    processes = Processes(env, tmp_path)
    processes.start("worker", [sys.executable, "-m", "celery", "-A", "cluster_ui", "worker", "--beat",
                               "--pool=solo", "--loglevel=INFO", "-s", str(tmp_path / "beat-schedule")])
    processes.start("ingest", [sys.executable, "manage.py", "ingest", "--block-ms", "200"])
    processes.start_agent("e2e-node", "2xA100-80GB")
    try:
        wait_for(lambda: Node.objects.filter(name="e2e-node").exists(), timeout=30, what="agent registration")
        yield processes
    except BaseException:
        print(processes.logs())
        raise
    finally:
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(processes.logs())
        processes.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
