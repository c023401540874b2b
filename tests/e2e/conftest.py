"""Real processes for end-to-end tests: a Celery worker with embedded beat and a simulated agent,
against the private Redis and the test database (committed data, so ``transactional_db``).

Agent authentication is on, as in production: the server processes get a random
``COLONY_AGENT_SECRET`` and each agent only its own key (:func:`agent_env`). As in production,
no process gets a secret in its environment: :meth:`Processes.start` moves ``COLONY_AGENT_SECRET``
and ``COLONY_AGENT_KEY`` into mode-600 files and passes ``*_FILE`` instead (``stack.env`` still
holds the secret, for tests that derive keys from it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
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


def wait_while_moving(measure, target: int, *, stall_s: float = 120.0, interval: float = 0.25,
                      what: str = "progress") -> int:
    """Wait until ``measure()`` reaches ``target``, for as long as it keeps rising: fail only once
    it has not moved for ``stall_s``. A loaded machine does the same work slower; a deadline for
    all of it, sized on an idle one, fails there while nothing is wrong."""
    best, moved = measure(), time.monotonic()
    while best < target:
        if time.monotonic() - moved > stall_s:
            raise AssertionError(f"no progress for {stall_s}s waiting for {what} ({best} of {target})")
        time.sleep(interval)
        now = measure()
        if now > best:
            best, moved = now, time.monotonic()
    return best


# A Celery worker with embedded beat, as the e2e and browser stacks run it: one process (solo
# pool) that consumes the default queue and the `scheduler` queue the scheduling cycle is routed
# to, so, as the scheduler of a deployment, it keeps its carry from cycle to cycle (a second one is
# a second scheduler, a standby). Mingle, gossip and worker heartbeats are Celery's
# worker-to-worker chatter, which Colony does not use (its scheduler lease lives in the database):
# mingle alone makes every start wait a second for neighbours.
WORKER_ARGV = [sys.executable, "-m", "celery", "-A", "cluster_ui", "worker", "--beat", "--pool=solo",
               "-Q", "celery,scheduler", "--loglevel=INFO", "--without-mingle", "--without-gossip",
               "--without-heartbeat"]


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

    def _in_files(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with each secret replaced by ``NAME_FILE``, a mode-600 file holding it."""
        env = dict(env)
        directory = self.log_dir / "secrets"
        directory.mkdir(mode=0o700, exist_ok=True)
        for name in ("COLONY_AGENT_SECRET", "COLONY_AGENT_KEY"):
            value = env.pop(name, None)
            if value:
                path = directory / f"{name.lower()}-{signing.sign(b'file-name', value)[:12]}"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.write(fd, value.encode())
                os.close(fd)
                env[f"{name}_FILE"] = str(path)
        return env

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env=self._in_files(self.env if env is None else env), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.started.append((name, process))
        return process

    def start_agent(self, node: str, spec: str) -> subprocess.Popen:
        return self.start(f"agent-{node}", [
            sys.executable, "-m", "agents", "--node", node, "--simulate", spec, "--redis", self.env["REDIS_URL"],
            "--interval", "0.2", "--heartbeat-ttl", "3", "--workdir", str(self.log_dir / f"agent-{node}"),
            "--allow-root-jobs",  # CI runs as root; accounts are tested in tests/agents/test_runner_sandbox.py
            # Jobs get a clean PATH, never the agent's: the python they run is this one, as make run's.
            "--job-path", str(Path(sys.executable).parent),
        ], env=agent_env(self.env, node))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))

    def stop_all(self) -> None:
        """Agents get SIGTERM: they stop their jobs, which would otherwise outlive them under their
        supervisors. The rest (workers, ingest) are killed outright: a test's end needs nothing of
        their warm shutdown, which waits out a blocking read (about a second each test), and the
        database rolls back whatever a killed process had open."""
        for name, process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM if name.startswith("agent") else signal.SIGKILL)
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


def stack_environment(live_redis: str, tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The environment of an e2e stack's server processes (worker, beat, ingest): fast ticks and
    short graces, required agent signatures; ``overrides`` on top."""
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
        # Lost after 13 s of silence (agents here have a 3 s heartbeat TTL), not 70 s as in production.
        "COLONY_NODE_LOST_GRACE_S": "10",
        "COLONY_REDIS_RESTART_GRACE_S": "6",
        "COLONY_AGENT_SECRET": agent_secret(),
        "COLONY_AGENT_AUTH": "required",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.update(overrides)
    return env


@pytest.fixture
def stack_overrides() -> dict[str, str]:
    """Environment the ``stack`` fixture's server processes get on top of :func:`stack_environment`'s;
    a test module overrides this fixture to change them."""
    return {}


@pytest.fixture
def stack(transactional_db, live_redis, tmp_path, request, settings, stack_overrides):
    """Worker + beat + one agent ``e2e-node`` with 2 simulated A100s; yields the Processes.

    The test process serves the API the tests call (as the web process would), so it holds the
    stack's agent secret too: the commands it publishes (a cancel's stop) are signed like the web
    server's. Without it the agent refuses them and the job waits for the worker's re-send."""
    from monitoring.models import Node

    env = stack_environment(live_redis, tmp_path, **stack_overrides)
    settings.COLONY_AGENT_SECRET, settings.COLONY_AGENT_AUTH = env["COLONY_AGENT_SECRET"], "required"
    processes = Processes(env, tmp_path)
    processes.start("worker", [*WORKER_ARGV, "-s", str(tmp_path / "beat-schedule")])
    # Ingest holds a filling 10 s bucket at most 2 s before writing it (the default, 15 s, writes
    # each once, when it is over): a bucket still reaches the rollups in held parts that merge, but
    # the tests that wait for rollups (outages, restarts, peaks) get them while their job still
    # runs instead of up to 12 s later, after it ended.
    processes.start("ingest", [sys.executable, "manage.py", "ingest", "--block-ms", "200", "--hold-s", "2"])
    processes.start_agent("e2e-node", "2xA100-80GB")
    try:
        wait_for(lambda: Node.objects.filter(name="e2e-node").exists(), timeout=120, what="agent registration")
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


# ---------------------------------------------------------------- the real dev stack


class DevStack:
    """A running ``python -m cluster_ui.devstack`` (see :func:`devstack`)."""

    def __init__(self, process: subprocess.Popen, port: int, var_dir: Path, out: Path):
        self.process, self.port, self.var_dir, self._out = process, port, var_dir, out

    def output(self) -> str:
        return self._out.read_text(errors="replace")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def children(self):
        import psutil

        return psutil.Process(self.process.pid).children(recursive=True)

    def command_lines(self) -> dict[int, str]:
        """pid -> command line of every live descendant; one that ends meanwhile (a zombie, a
        short-lived helper) is skipped rather than failing the test."""
        import psutil

        lines = {}
        for process in self.children():
            try:
                lines[process.pid] = " ".join(process.cmdline())
            except psutil.Error:
                continue
        return lines

    def child_pid(self, *words: str) -> int | None:
        """The pid of the supervised child whose command line holds every word (None: none now)."""
        import psutil

        for child in psutil.Process(self.process.pid).children():
            try:
                cmdline = child.cmdline()
                if all(word in cmdline for word in words) and child.status() != psutil.STATUS_ZOMBIE:
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def api(self, method: str, path: str, token: str | None = None, data: dict | None = None) -> dict:
        body = json.dumps(data).encode() if data is not None else None
        request = urllib.request.Request(f"{self.url}/api/v1/{path}", data=body, method=method,
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Token {token}"} if token else {})})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def token(self, username: str, password: str = "colony-demo") -> str:
        return self.api("POST", "auth/token/", data={"username": username, "password": password})["token"]

    def run_job(self, token: str, command: list[str], timeout: float = 60) -> dict:
        """Submit a one-GPU job and wait for it to end; returns the job as the API shows it."""
        return self.wait_for_end(token, self.api("POST", "jobs/", token, {"command": command, "gpus": 1}), timeout)

    def run_jobs(self, token: str, commands: list[list[str]], timeout: float = 60) -> list[dict]:
        """:meth:`run_job` for each command, all submitted before any is waited for (they run side
        by side, as the stack's GPUs allow, rather than one scheduling cycle after another)."""
        jobs = [self.api("POST", "jobs/", token, {"command": command, "gpus": 1}) for command in commands]
        return [self.wait_for_end(token, job, timeout) for job in jobs]

    def wait_for_end(self, token: str, job: dict, timeout: float = 60) -> dict:
        def finished():
            try:
                current = self.api("GET", f"jobs/{job['id']}/", token)
            except OSError:
                return None
            return current if current["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT") else None

        return wait_for(finished, timeout=timeout, interval=0.5, what=f"job {job['id']} to end")

    def get(self, path: str):
        """GET ``path`` without following anything; ``status`` and ``body`` of the answer (4xx too)."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as response:
                return types.SimpleNamespace(status=response.status, body=response.read())
        except urllib.error.HTTPError as error:
            return types.SimpleNamespace(status=error.code, body=error.read())

    def login_page_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


@contextlib.contextmanager
def devstack(var_dir: Path, nodes: tuple[str, ...] = ("2xT4-16GB", "2xT4-16GB"), extra_env: dict | None = None):
    """Start ``python -m cluster_ui.devstack`` on a free port with its own ``var_dir`` (SQLite, as a
    newcomer runs it), wait for the banner and the web server; stop it with SIGINT on exit."""
    from cluster_ui.devstack.redis_server import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env["COLONY_VAR_DIR"] = str(var_dir)
    env.update(extra_env or {})
    var_dir.mkdir(parents=True, exist_ok=True)
    out = var_dir.parent / f"{var_dir.name}-devstack.out"
    with open(out, "w+b") as log:
        argv = [sys.executable, "-m", "cluster_ui.devstack", "--port", str(port)]
        for spec in nodes:
            argv += ["--node", spec]
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stack = DevStack(process, port, var_dir, out)
        try:
            wait_for(lambda: "Colony is up." in stack.output() or process.poll() is not None, timeout=120,
                     what="the banner")
            assert process.poll() is None, stack.output()
            wait_for(stack.login_page_answers, timeout=30, what="the web server")
            yield stack
        except BaseException:
            print(stack.output())
            for name in sorted(var_dir.glob("log/*.log")):
                print(f"--- {name.name}\n{name.read_text(errors='replace')[-3000:]}")
            raise
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(45)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture
def devstack_dir():
    """A var dir for :func:`devstack` that job accounts can pass through (pytest's own tmp_path is
    under a 0700 directory, where a stack run as root would have to run jobs as root)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="colony-devstack-"))
    os.chmod(path, 0o711)
    try:
        yield path / "var"
    finally:
        shutil.rmtree(path, ignore_errors=True)
