"""Which nodes are alive: their heartbeat keys judged in one round trip, however many nodes."""

import time

import pytest

from agents.protocol import heartbeat_key
from monitoring.services.health import MAX_HEARTBEAT_TTL_S, live_node_names, silent_node_names


@pytest.fixture
def counted(redis_client, monkeypatch):
    """The client, with every command it sends to Redis counted."""
    sent = []
    execute = redis_client.execute_command

    def counting(*args, **kwargs):
        sent.append(args[0])
        return execute(*args, **kwargs)

    monkeypatch.setattr(redis_client, "execute_command", counting)
    return redis_client, sent


def test_live_expired_absent_and_unknown_nodes_answered_in_one_round_trip(counted):
    client, sent = counted
    client.set(heartbeat_key("live"), "{}", ex=10)
    client.set(heartbeat_key("at-the-limit"), "{}", ex=MAX_HEARTBEAT_TTL_S)
    client.set(heartbeat_key("expired"), "{}", px=1)
    client.set(heartbeat_key("forever"), "{}")  # (no expiry: not a heartbeat)
    client.set(heartbeat_key("ten-years"), "{}", ex=10 * 365 * 24 * 3600)
    time.sleep(0.01)
    sent.clear()

    names = ["live", "expired", "absent", "at-the-limit", "forever", "ten-years", "never-registered"]
    assert live_node_names(client, names) == {"live", "at-the-limit"}
    assert len(sent) == 1


def test_a_thousand_nodes_are_one_command(counted):
    client, sent = counted
    names = [f"node{i:04d}" for i in range(1024)]
    pipe = client.pipeline(transaction=False)
    for name in names[::3]:
        pipe.set(heartbeat_key(name), "{}", ex=10)
    pipe.execute()
    sent.clear()

    assert live_node_names(client, names) == set(names[::3])
    assert len(sent) == 1


def test_no_names_ask_nothing(counted):
    client, sent = counted
    assert live_node_names(client, []) == set()
    assert sent == []


def test_the_silent_are_exactly_those_not_live(redis_client):
    names = [f"n{i}" for i in range(30)]
    for name in names[::3]:
        redis_client.set(heartbeat_key(name), "{}", ex=10)
    redis_client.set(heartbeat_key("n1"), "{}")  # no expiry: not a heartbeat
    assert silent_node_names(redis_client, names) == [n for n in names if n not in set(names[::3])]
    assert silent_node_names(redis_client, []) == []
