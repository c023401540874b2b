"""``python -m cluster_ui.devstack``: the whole of Colony on one machine, on embedded defaults.

Starts a private Redis, migrates and seeds the database (SQLite unless ``DATABASE_URL`` says
otherwise), then a Celery worker, Celery beat, a metrics ingest reader, one simulated agent per
node and the web server. Agents authenticate as in production: the stack makes a random
``COLONY_AGENT_SECRET`` for its run (unless one is set) and hands each agent only its own key.
Ctrl-C (or SIGTERM) stops every child, newest first, and leaves no orphan: each child runs in its
own process group, which is signalled as a whole, and also gets SIGTERM if this process dies.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agents import signing
from cluster_ui.devstack.redis_server import PrivateRedis, free_port

BASE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_NODES = ["8xA100-80GB", "8xA100-80GB", "8xV100-32GB"]
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux only; elsewhere the process-group shutdown below still applies.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    name: str
    process: subprocess.Popen


class Supervisor:
    def __init__(self, var_dir: Path, env: dict[str, str]):
        self.log_dir = var_dir / "log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(
            argv, cwd=BASE_DIR, env=self.env if env is None else env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.close()
        child = Child(name, process)
        self.children.append(child)
        return child

    def first_dead(self) -> Child | None:
        return next((child for child in self.children if child.process.poll() is not None), None)

    def stop_all(self, grace: float = 10.0) -> None:
        for child in reversed(self.children):
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {child.name} did not stop in {grace:.0f}s; killing it", flush=True)
            # Whatever is left of the group (a Celery pool process, say) goes too.
            _signal_group(child.process, signal.SIGKILL)
            child.process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def agent_environment(server_env: dict[str, str], node: str) -> dict[str, str]:
    """An agent's environment: the server's without the agent secret, plus this node's key only."""
    env = {name: value for name, value in server_env.items()
           if name not in ("COLONY_AGENT_SECRET", "COLONY_AGENT_SECRET_FILE")}
    env["COLONY_AGENT_KEY"] = signing.node_key(server_env["COLONY_AGENT_SECRET"], node).hex()
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cluster_ui.devstack", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="web server port (default 8000)")
    parser.add_argument("--node", action="append", dest="nodes", metavar="SPEC",
                        help="a simulated node's GPUs, e.g. 8xA100-80GB; repeat per node "
                             f"(default: {' '.join(DEFAULT_NODES)})")
    parser.add_argument("--password", default="colony-demo", help="demo users' password")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = sys.executable
    var_dir = Path(os.environ.get("COLONY_VAR_DIR", BASE_DIR / "var"))
    if not free_port(args.port) == args.port:
        print(f"Port {args.port} is taken; pass --port to use another.", file=sys.stderr)
        return 2

    redis = PrivateRedis(var_dir / "redis", port=free_port(6380)).start()
    env = dict(os.environ)
    env.update({
        "REDIS_URL": redis.url,
        "DJANGO_DEBUG": env.get("DJANGO_DEBUG", "1"),
        "PYTHONUNBUFFERED": "1",
        # Jobs' `python` is this virtualenv's interpreter.
        "PATH": f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    # Agents authenticate in the demo too: a secret for this run, unless the developer set one.
    if env.get("COLONY_AGENT_SECRET_FILE"):
        env["COLONY_AGENT_SECRET"] = Path(env.pop("COLONY_AGENT_SECRET_FILE")).read_text().strip()
    env.setdefault("COLONY_AGENT_SECRET", secrets.token_hex(32))
    supervisor = Supervisor(var_dir, env)
    stopping = False

    def request_stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        for step in (["migrate", "--noinput", "-v0"], ["seed_demo", "--password", args.password]):
            subprocess.run([python, "manage.py", *step], cwd=BASE_DIR, env=env, check=True)
        supervisor.start("worker", [python, "-m", "celery", "-A", "cluster_ui", "worker", "--loglevel=INFO",
                                    "--concurrency=2", "-n", "worker@%h"])
        supervisor.start("beat", [python, "-m", "celery", "-A", "cluster_ui", "beat", "--loglevel=INFO"])
        supervisor.start("ingest", [python, "manage.py", "ingest"])
        for number, spec in enumerate(args.nodes or DEFAULT_NODES, start=1):
            # Dev only: the demo's jobs run as whoever runs the stack, root included (as in CI).
            # A real node names unprivileged accounts with --run-as/--run-as-tenant instead.
            node = f"node-{number}"
            supervisor.start(f"agent-{node}", [python, "-m", "agents", "--node", node,
                                               "--simulate", spec, "--redis", redis.url,
                                               "--workdir", str(var_dir / "agent" / node),
                                               "--allow-root-jobs"], env=agent_environment(env, node))
        supervisor.start("web", [python, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload"])
        _banner(args, redis.url, supervisor.log_dir)
        while not stopping:
            dead = supervisor.first_dead()
            if dead:
                print(f"{dead.name} exited with code {dead.process.returncode}; see "
                      f"{supervisor.log_dir / (dead.name + '.log')}. Stopping.", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"set-up step failed: {' '.join(map(str, exc.cmd))}", file=sys.stderr)
        return 1
    finally:
        print("Stopping Colony...", flush=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        supervisor.stop_all()
        redis.stop()
        print("Stopped.", flush=True)


def _banner(args: argparse.Namespace, redis_url: str, log_dir: Path) -> None:
    url = f"http://127.0.0.1:{args.port}/"
    print(f"""
Colony is up.
  Web:     {url}   (queue at {url}jobs/, admin at {url}admin/)
  Logins:  alice / {args.password}  (researcher, tenant vision)
           bob / {args.password}    (researcher, tenant nlp)
           operator / {args.password}  (staff: admin panel)
  API:     curl -s -X POST {url}api/v1/auth/token/ -d username=alice -d password={args.password}
           curl -s -H "Authorization: Token <token>" -H "Content-Type: application/json" \\
                -d '{{"command": ["python", "-c", "print(42)"], "gpus": 1}}' {url}api/v1/jobs/
  Redis:   {redis_url}
  Agents:  sign their messages with per-node keys (a secret made for this run)
  Logs:    {log_dir}/
Press Ctrl-C to stop everything.
""", flush=True)
