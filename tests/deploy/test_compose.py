"""There is no Docker engine here, so check what we can: every service in docker-compose.yml
runs an entry point that exists in this project, every long-running one has a health check of
its own work (beat's, ingest's and the agents' are run here, healthy and not), and each starts
only once what it needs is healthy or, for one-shot services, completed."""

import importlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis as redis_lib
import yaml
from django.core.management import get_commands

from agents import protocol
from cluster_ui.devstack.credentials import write_credentials
from cluster_ui.devstack.redis_server import free_port, redis_server_binary, redis_server_version
from monitoring.services.ingest import GROUP as INGEST_GROUP
from agents.streams import ensure_group

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
OUR_SERVICES = {name: svc for name, svc in COMPOSE["services"].items() if "image" not in svc or "build" in svc}


def test_compose_has_the_production_shaped_stack():
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(COMPOSE["services"])
    assert sum(1 for name in COMPOSE["services"] if name.startswith("agent")) >= 2
    assert (ROOT / "Dockerfile").is_file()


def _check_entry_point(argv: list[str]) -> None:
    program, *args = argv
    if program == "gunicorn":
        module, attr = args[0].split(":")
        assert hasattr(importlib.import_module(module), attr), args[0]
    elif program == "celery":
        assert importlib.util.find_spec(args[args.index("-A") + 1]) is not None
        assert args[2] in {"worker", "beat"}, args
    elif program == "python" and args[0] == "-m":
        assert importlib.util.find_spec(f"{args[1]}.__main__") is not None, args[1]
    elif program == "python" and args[0] == "manage.py":
        assert args[1] in get_commands(), args[1]
    else:
        pytest.fail(f"unknown entry point {argv}")


@pytest.mark.parametrize("service", sorted(OUR_SERVICES))
def test_service_command_names_an_entry_point_that_exists(service):
    _check_entry_point(OUR_SERVICES[service]["command"])


def test_dockerfile_default_command_exists():
    line = next(text for text in (ROOT / "Dockerfile").read_text().splitlines() if text.startswith("CMD"))
    _check_entry_point(yaml.safe_load(line.removeprefix("CMD ")))


# ---------------------------------------------------------------- health checks and start order

ONE_SHOT = {name for name, svc in COMPOSE["services"].items() if svc.get("restart") == "no"}
TRIVIAL = {"true", "/bin/true", "exit 0", ":", "echo ok"}


def test_every_long_running_service_has_a_health_check_of_its_own_work():
    assert ONE_SHOT == {"credentials", "migrate"}
    for name, service in COMPOSE["services"].items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no health check"
        kind, *command = check["test"]
        assert kind in ("CMD", "CMD-SHELL") and command, name
        assert " ".join(command).strip() not in TRIVIAL and len(" ".join(command)) > 20, f"{name}: {command}"
        assert check.get("interval") and check.get("retries"), name


def test_each_service_starts_once_what_it_needs_is_healthy_or_done():
    for name, service in COMPOSE["services"].items():
        for needed, how in (service.get("depends_on") or {}).items():
            wanted = "service_completed_successfully" if needed in ONE_SHOT else "service_healthy"
            assert how == {"condition": wanted}, f"{name} -> {needed}: {how}"
    servers = [name for name, svc in COMPOSE["services"].items()
               if "DATABASE_URL_FILE" in (svc.get("environment") or {}) and name != "migrate"]
    assert {"web", "worker", "beat", "ingest"} <= set(servers)
    for name in servers:
        assert "migrate" in COMPOSE["services"][name]["depends_on"], f"{name} may start on an unmigrated schema"
    assert {"scheduler"} <= set(servers)
    assert COMPOSE["services"]["worker"]["deploy"]["replicas"] >= 2  # general work survives one dying


def _option(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name:
            return argv[index + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def test_one_solo_scheduler_consumes_the_scheduler_queue_and_the_workers_do_not():
    """The scheduling cycle keeps what it carries between cycles only in one long-lived process:
    a prefork worker's children would each take the lease in turn (jobs/services/scheduling_loop.py)."""
    scheduler, worker = COMPOSE["services"]["scheduler"], COMPOSE["services"]["worker"]
    assert scheduler["command"][:4] == ["celery", "-A", "cluster_ui", "worker"]
    assert _option(scheduler["command"], "--pool") == "solo"
    assert _option(scheduler["command"], "-Q") == "scheduler"
    assert scheduler.get("deploy", {}).get("replicas", 1) == 1
    assert _option(worker["command"], "-Q") == "celery"
    consumers = [name for name, service in COMPOSE["services"].items()
                 if "scheduler" in (_option(service.get("command") or [], "-Q") or "").split(",")]
    assert consumers == ["scheduler"]


def run_check(service: str, *, paths: dict[str, str] | None = None, env: dict[str, str] | None = None) -> int:
    """Run ``service``'s health check here, with its container paths swapped for test ones."""
    kind, *argv = COMPOSE["services"][service]["healthcheck"]["test"]
    assert kind == "CMD" and argv[0] == "python"
    argv[0] = sys.executable
    for old, new in (paths or {}).items():
        argv = [arg.replace(old, new) for arg in argv]
    return subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, timeout=30).returncode


def test_beat_is_healthy_while_it_keeps_saving_its_schedule(tmp_path):
    paths = {"/var/lib/colony/": f"{tmp_path}/"}
    assert run_check("beat", paths=paths) != 0  # never ticked
    saved = tmp_path / "celerybeat-schedule.db"
    saved.write_bytes(b"")
    assert run_check("beat", paths=paths) == 0
    os.utime(saved, (time.time() - 400, time.time() - 400))  # no save for over 5 minutes
    assert run_check("beat", paths=paths) != 0


@pytest.fixture
def compose_redis(tmp_path):
    """A Redis configured as compose configures it (password, one ACL user per node); yields
    the credentials directory with each redis-url pointed at it."""
    if redis_server_version(redis_server_binary()) < (7,):
        pytest.skip("per-node ACL users need Redis 7 (compose runs redis:7)")
    write_credentials(tmp_path, ["node-1"], chown=False)
    port = free_port()
    server = subprocess.Popen([redis_server_binary(), str(tmp_path / "redis" / "redis.conf"), "--port", str(port),
                               "--bind", "127.0.0.1", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for url_file in (tmp_path / "server" / "redis-url", tmp_path / "node-1" / "redis-url"):
            url_file.write_text(url_file.read_text().replace("@redis:6379/", f"@127.0.0.1:{port}/"))
        admin = redis_lib.Redis.from_url((tmp_path / "server" / "redis-url").read_text().strip())
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.ping()
                break
            except redis_lib.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        yield tmp_path
    finally:
        server.terminate()
        server.wait(10)


def test_an_ingest_reader_is_healthy_while_it_reads_the_metrics_stream(compose_redis):
    env = {"REDIS_URL_FILE": str(compose_redis / "server" / "redis-url")}
    assert run_check("ingest", env=env) != 0  # no reader yet
    client = redis_lib.Redis.from_url((compose_redis / "server" / "redis-url").read_text().strip())
    ensure_group(client, protocol.METRICS_STREAM, INGEST_GROUP)
    for reader in ("another-host-1", f"{socket.gethostname()}-1"):
        # An entry to read: Redis < 7.2 lists a reader (and counts its idle time) only from its
        # first entry; compose's redis:7 (7.2 and later) counts every read, entries or none.
        client.xadd(protocol.METRICS_STREAM, {"m": "x"})
        client.xreadgroup(INGEST_GROUP, reader, {protocol.METRICS_STREAM: ">"}, count=1)
        if reader == "another-host-1":
            assert run_check("ingest", env=env) != 0  # a reader, but not this container's
    assert run_check("ingest", env=env) == 0


def test_an_agent_is_healthy_while_it_runs_and_redis_takes_its_own_login(compose_redis):
    url_file = compose_redis / "node-1" / "redis-url"
    assert run_check("agent-1", paths={"/run/colony/node/redis-url": str(url_file)}) == 0
    wrong = compose_redis / "wrong-url"
    password = urlsplit(url_file.read_text().strip()).password
    wrong.write_text(url_file.read_text().replace(f":{password}@", ":not-its-password@"))
    assert run_check("agent-1", paths={"/run/colony/node/redis-url": str(wrong)}) != 0
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        assert run_check("agent-1", paths={"/run/colony/node/redis-url": str(url_file),
                                           "/proc/1/stat": f"/proc/{stopped.pid}/stat"}) != 0
    finally:
        stopped.kill()
        stopped.wait()
