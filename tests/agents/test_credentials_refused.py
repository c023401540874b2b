"""An agent process whose Redis login or rights are refused exits 78 (EX_CONFIG) with the reason
on stderr, which systemd shows as failed and does not restart (agents/systemd/); one whose Redis is
merely unreachable keeps trying and registers once Redis answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_lib

from agents import protocol
from agents.cli import EXIT_CREDENTIALS_REFUSED
from cluster_ui.devstack.redis_server import PrivateRedis, free_port
from tests.agents.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "admin-password-0123456789"
NODE_PASSWORD = "node-password-0123456789"
USER = "colony-node-node-a"
# A node user as Redis 6 and 7 both take it; its exact rights are tests/agents/test_redis_acl.py's.
ALL_RIGHTS = ["on", f">{NODE_PASSWORD}", "~*", "&*", "+@all"]


def start_agent(tmp_path: Path, url: str) -> subprocess.Popen:
    url_file = tmp_path / "redis-url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o600)
    return subprocess.Popen(
        [sys.executable, "-m", "agents", "--node", "node-a", "--simulate", "1xT4-16GB", "--redis-file", str(url_file),
         "--interval", "0.2", "--workdir", str(tmp_path / "work"), "--allow-root-jobs"],
        cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("COLONY_")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def ended(agent: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _out, err = agent.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        agent.kill()
        _out, err = agent.communicate()
        pytest.fail(f"the agent was still running after {timeout}s:\n{err[-3000:]}")
    return agent.returncode, err


@pytest.fixture
def acl_redis(tmp_path):
    def start(rights: list[str], port: int | None = None) -> PrivateRedis:
        server = PrivateRedis(tmp_path / "redis", port=port, password=ADMIN_PASSWORD, acl_users={USER: rights})
        started.append(server.start())
        return server

    started: list[PrivateRedis] = []
    yield start
    for server in started:
        server.stop()


def test_a_refused_password_ends_the_agent_with_the_reason(tmp_path, acl_redis):
    redis = acl_redis(ALL_RIGHTS)
    agent = start_agent(tmp_path, redis.user_url(USER, "not-its-password"))
    code, err = ended(agent, timeout=20)
    assert code == EXIT_CREDENTIALS_REFUSED == 78, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "Redis refused node node-a's credentials" in last and "invalid username-password pair" in last, err
    assert f"redis://{USER}:***@127.0.0.1:{redis.port}/0" in last and "not-its-password" not in err


def test_a_login_without_the_rights_to_register_ends_the_agent(tmp_path, acl_redis):
    redis = acl_redis(["on", f">{NODE_PASSWORD}", "+ping"])  # logs in, may do nothing else
    agent = start_agent(tmp_path, redis.user_url(USER, NODE_PASSWORD))
    code, err = ended(agent, timeout=20)
    assert code == EXIT_CREDENTIALS_REFUSED, err[-3000:]
    assert "no permissions" in err.strip().splitlines()[-1], err


def test_an_unreachable_redis_is_retried_until_it_answers(tmp_path, acl_redis):
    port = free_port()
    agent = start_agent(tmp_path, f"redis://{USER}:{NODE_PASSWORD}@127.0.0.1:{port}/0")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            agent.wait(3)  # connection refused: transient, not a reason to exit
        redis = acl_redis(ALL_RIGHTS, port=port)
        admin = redis_lib.Redis.from_url(redis.url)
        wait_for(lambda: admin.xlen(protocol.node_events_stream("node-a")), timeout=20)
        admin.close()
        assert agent.poll() is None
    finally:
        agent.terminate()
        code, err = ended(agent, timeout=20)
    assert code == 0, err[-3000:]
    assert "Redis unavailable" in err and "connected to Redis" in err
