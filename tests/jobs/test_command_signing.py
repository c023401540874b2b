"""Commands the control plane publishes are MACed with the target node's key, name the node and
when they were issued (a launch its attempt), and a real agent holding that key applies them."""

from __future__ import annotations

import threading
import time

import pytest

from agents import protocol, signing
from agents.accounts import RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.runner import JobRunner
from jobs.services.commands import send_duty_cycle, send_launch, send_stop
from tests.agents.helpers import events, python, wait_for

SECRET = "c" * 40


def published(redis_client, node: str) -> list[tuple[dict, protocol._Command]]:
    return [(fields, protocol.decode_command(fields))
            for _id, fields in redis_client.xrange(protocol.command_stream(node))]


@pytest.fixture
def secret(settings, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    return SECRET


def test_every_published_command_verifies_with_its_nodes_key_and_no_other(secret, redis_client):
    before = time.time()
    send_launch("n1", 5, ["true"], (0, 1), attempt=2, duty_cycle=0)  # launched suspended: launch + suspend
    send_stop("n1", 5)
    send_duty_cycle("n1", 5, 0.5, resume=True)
    send_stop("n2", 6)
    key, other = signing.node_key(secret, "n1"), signing.node_key(secret, "n2")

    commands = published(redis_client, "n1")
    assert [c.kind for _f, c in commands] == ["launch", "suspend", "stop", "set_duty_cycle", "resume"]
    for fields, command in commands:
        assert signing.verify_command(key, fields[b"m"], fields[b"sig"])
        assert not signing.verify_command(other, fields[b"m"], fields[b"sig"])
        assert not signing.verify(key, fields[b"m"], fields[b"sig"])  # not an agent-message signature
        assert command.node == "n1" and before <= command.issued_at <= time.time()
    launch = commands[0][1]
    assert (launch.command_id, launch.attempt) == ("launch-5-2", 2)
    [(fields, stop)] = published(redis_client, "n2")
    assert stop.node == "n2" and signing.verify_command(other, fields[b"m"], fields[b"sig"])


def test_a_re_sent_launch_is_issued_afresh(secret, redis_client):
    send_launch("n1", 5, ["true"], (0,), attempt=1)
    time.sleep(0.01)
    send_launch("n1", 5, ["true"], (0,), attempt=1)
    (_f1, first), (_f2, second) = published(redis_client, "n1")
    assert first.command_id == second.command_id == "launch-5-1"
    assert second.issued_at > first.issued_at


def test_without_a_secret_commands_go_unsigned_but_still_name_node_and_time(settings, live_redis, redis_client):
    settings.COLONY_AGENT_SECRET = ""
    send_launch("n1", 5, ["true"], (0,))
    [(fields, launch)] = published(redis_client, "n1")
    assert set(fields) == {b"m"}
    assert launch.node == "n1" and launch.issued_at is not None and launch.attempt == 0


def test_a_real_agent_with_the_nodes_key_runs_what_the_control_plane_sends(secret, redis_client, redis_url, tmp_path):
    runner = JobRunner(tmp_path / "agent", duty_period=0.5, run_as=RunAsPolicy(allow_root=True))
    agent = Agent("n1", SimulatedBackend("2xT4-16GB", "n1"), redis_url, runner, interval=0.1, heartbeat_ttl=5,
                  shutdown_grace=1, key=signing.node_key(secret, "n1"))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: events(redis_client, "node_registered"))
        send_launch("n1", 41, python("print('from the control plane')"), (1,), attempt=0)
        exited = wait_for(lambda: [e for e in events(redis_client, "job_exited") if e.job_id == 41], timeout=10)
        assert exited[0].exit_code == 0 and "from the control plane" in exited[0].output_tail
        assert redis_client.xlen(protocol.DEAD_LETTER_STREAM) == 0
    finally:
        stop.set()
        thread.join(10)
        runner.close()
    assert not thread.is_alive()
