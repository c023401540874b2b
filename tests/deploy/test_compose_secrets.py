"""docker compose keeps every secret out of every environment: the `credentials` service writes
them as files (600, one volume per consumer), Redis requires a password and gives each agent its
own ACL user (no value over 1 MiB), and every long-running service restarts and (the servers) has a
health check."""

import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis as redis_lib
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from agents import protocol, signing
from cluster_ui.devstack.credentials import write_credentials
from cluster_ui.devstack.redis_server import free_port, redis_server_binary, redis_server_version

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SECRET_NAMES = ("DJANGO_SECRET_KEY", "COLONY_AGENT_SECRET", "COLONY_AGENT_KEY", "POSTGRES_PASSWORD", "REDIS_URL",
                "DATABASE_URL", "CELERY_BROKER_URL", "COLONY_CACHE_URL", "COLONY_REDIS_URL",
                "COLONY_OIDC_CLIENT_SECRET")


def _environment(service: dict) -> dict:
    env = service.get("environment") or {}
    return dict(item.split("=", 1) for item in env) if isinstance(env, list) else env


def test_no_service_gets_a_secret_in_its_environment_or_command():
    for name, service in SERVICES.items():
        env = _environment(service)
        assert not set(env) & set(SECRET_NAMES), (name, env)
        assert all(value.startswith("/run/colony/") for key, value in env.items() if key.endswith("_FILE")), name
        command = " ".join(map(str, service.get("command", [])))
        assert "redis://" not in command and "postgres://" not in command, name
    env_example = (ROOT / ".env.example").read_text()
    assert not [line for line in env_example.splitlines() if line.split("=")[0] in SECRET_NAMES]


def test_each_agent_mounts_only_its_own_nodes_credentials():
    agents = {name: service for name, service in SERVICES.items() if name.startswith("agent")}
    assert len(agents) >= 2
    for name, service in agents.items():
        node = service["command"][service["command"].index("--node") + 1]
        assert service["volumes"] == [f"cred-{node}:/run/colony/node:ro"], name
        assert {"--key-file", "--redis-file"} <= set(service["command"])
        # Root, so that its jobs run as another account (which cannot read the agent's files).
        assert service["user"] == "root" and "--run-as" in service["command"]
    nodes = SERVICES["credentials"]["command"]
    assert all(service["command"][service["command"].index("--node") + 1] in nodes for service in agents.values())


def test_long_running_services_restart_and_the_servers_have_health_checks():
    for name, service in SERVICES.items():
        if name not in ("credentials", "migrate"):
            assert service.get("restart") == "unless-stopped", name
    for name in ("postgres", "redis", "web", "worker"):
        assert SERVICES[name]["healthcheck"]["test"], name
    assert "REDISCLI_AUTH" in " ".join(SERVICES["redis"]["healthcheck"]["test"])
    assert "inspect ping" in " ".join(SERVICES["worker"]["healthcheck"]["test"])


def test_credentials_are_private_files_kept_across_runs(tmp_path):
    write_credentials(tmp_path, ["node-1", "node-2"], chown=False)
    for directory in ("server", "redis", "postgres", "node-1", "node-2"):
        assert (tmp_path / directory).stat().st_mode & 0o777 == 0o700
        assert {f.stat().st_mode & 0o777 for f in (tmp_path / directory).iterdir()} == {0o600}
    secret = (tmp_path / "server" / "agent-secret").read_text().strip()
    assert (tmp_path / "node-1" / "node.key").read_text().strip() == signing.node_key(secret, "node-1").hex()
    assert urlsplit((tmp_path / "node-2" / "redis-url").read_text().strip()).username == "colony-node-node-2"
    assert not (tmp_path / "node-1" / "agent-secret").exists()
    before = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    write_credentials(tmp_path, ["node-1", "node-2"], chown=False)
    assert before == {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}


def test_the_redis_config_requires_the_password_and_each_node_is_its_own_user(tmp_path):
    if redis_server_version(redis_server_binary()) < (7,):
        pytest.skip("per-node ACL users need Redis 7 (compose runs redis:7)")
    write_credentials(tmp_path, ["node-1", "node-2"], chown=False)
    port = free_port()
    server = subprocess.Popen([redis_server_binary(), str(tmp_path / "redis" / "redis.conf"), "--port", str(port),
                               "--bind", "127.0.0.1", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        password = (tmp_path / "redis" / "password").read_text().strip()
        admin = redis_lib.Redis(port=port, password=password, retry=Retry(NoBackoff(), 0))  # the loop below waits
        deadline = time.monotonic() + 10
        while True:
            try:
                assert admin.ping()
                break
            except redis_lib.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis(port=port, retry=Retry(NoBackoff(), 0)).get("x")

        def node_client(node):
            url = urlsplit((tmp_path / node / "redis-url").read_text().strip())
            # No retries: the server's refusals below must fail at once, not after backoff.
            return redis_lib.Redis(port=port, username=url.username, password=url.password,
                                   retry=Retry(NoBackoff(), 0))

        node_1 = node_client("node-1")
        assert node_1.ping()
        admin.xadd(protocol.command_stream("node-2"), {"m": "x"})
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            node_1.xrange(protocol.command_stream("node-2"))
        # No value over 1 MiB: a node cannot park megabytes in its own stream or heartbeat.
        with pytest.raises(redis_lib.RedisError):
            node_1.xadd(protocol.node_events_stream("node-1"), {"m": b"x" * (2 * 1024 * 1024)})
        with pytest.raises(redis_lib.RedisError):
            node_1.set(protocol.heartbeat_key("node-1"), b"x" * (2 * 1024 * 1024), ex=60)
        assert not admin.exists(protocol.node_events_stream("node-1"), protocol.heartbeat_key("node-1"))
        assert admin.config_get("client-query-buffer-limit")["client-query-buffer-limit"] == str(2 * 1024 * 1024)
    finally:
        server.terminate()
        server.wait(10)
