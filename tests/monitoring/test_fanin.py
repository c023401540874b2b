"""Nodes write only their own streams; the control plane fans them in. What one node does to its
own stream (trim it to nothing, exhaust its IDs, flood it, write garbage) never costs another
node an event, and nothing is copied twice however many readers fan in at once."""

import threading
import time

import pytest

from agents import protocol, signing
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from monitoring.services import fanin
from monitoring.services.dead_letters import dead_letter_count
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "fan-in-test-secret-0123456789abcdef"


@pytest.fixture
def signed_events(settings, db, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


def write(client, node: str, message, **xadd):
    """What ``node``'s agent does: append a signed message to its own stream."""
    stream = protocol.node_events_stream(node) if not isinstance(message, protocol.NodeSample) \
        else protocol.node_metrics_stream(node)
    fields = signing.signed(protocol.encode(message), signing.node_key(SECRET, node))
    return client.xadd(stream, fields, **xadd)


def exited(node, job, code=0):
    return protocol.JobExited(node=node, job_id=job.pk, exit_code=code, finished_at=time.time())


def running_on(node_name):
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name=node_name), index=0))
    return job


def test_an_exit_on_a_nodes_own_stream_reaches_the_job(signed_events, redis_client):
    job = running_on("node-a")
    write(redis_client, "node-a", exited("node-a", job))
    consume_events(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


@pytest.mark.parametrize("attack", ["trim to nothing", "exhaust the stream IDs", "flood"])
def test_what_a_node_does_to_its_own_stream_costs_no_other_node_an_exit(signed_events, redis_client, attack,
                                                                       monkeypatch):
    victim, attacker = running_on("node-a"), running_on("node-b")
    write(redis_client, "node-a", exited("node-a", victim))
    mine = protocol.node_events_stream("node-b")
    if attack == "trim to nothing":
        write(redis_client, "node-b", exited("node-b", attacker), maxlen=0)
    elif attack == "exhaust the stream IDs":
        redis_client.xadd(mine, {"m": "x"}, id="18446744073709551615-18446744073709551615")
    else:
        monkeypatch.setattr(fanin, "BACKLOG_CAP", 50)
        pipe = redis_client.pipeline(transaction=False)
        for _ in range(2000):
            pipe.xadd(mine, {"m": "{}"})
        pipe.execute()
    consume_events(redis_client)
    victim.refresh_from_db()
    assert victim.state == JobState.SUCCEEDED
    if attack == "flood":
        # Its backlog beyond the cap is dropped and counted; one round copies a bounded share.
        assert redis_client.xlen(mine) <= 51
        assert int(redis_client.hget(fanin.STATS_KEY, "events_dropped")) >= 2000 - fanin.PER_NODE["events"] - 51


def test_nothing_is_copied_twice_by_readers_fanning_in_at_once(redis_client):
    for i in range(300):
        redis_client.xadd(protocol.node_events_stream(f"n{i % 3}"), {"m": f'{{"i": {i}}}'})
    threads = [threading.Thread(target=fanin.fan_in, args=(redis_client, "events")) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fanin.fan_in(redis_client, "events")
    copied = [fields[b"m"] for _id, fields in redis_client.xrange(protocol.EVENTS_STREAM)]
    assert sorted(copied) == sorted(f'{{"i": {i}}}'.encode() for i in range(300))
    # Each node's own order is kept.
    for node in range(3):
        mine = [int(m[6:-1]) for m in copied if int(m[6:-1]) % 3 == node]
        assert mine == sorted(mine)


@pytest.mark.parametrize("fields, reason", [
    ({"m": "{}", "evil": "1"}, b"unexpected stream field: evil"),
    ({"sig": "ab"}, b"missing field 'm'"),
    ({"m": "x" * (protocol.MAX_MESSAGE_BYTES + 1)}, b"exceeds"),
])
def test_a_malformed_entry_is_dead_lettered_at_fan_in_and_the_next_one_copied(redis_client, fields, reason):
    stream = protocol.node_events_stream("n1")
    redis_client.xadd(stream, fields)
    redis_client.xadd(stream, {"m": "next", "sig": "s"})
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.rejected) == (1, 1)
    assert [f for _, f in redis_client.xrange(protocol.EVENTS_STREAM)] == [{b"m": b"next", b"sig": b"s"}]
    (letter,) = [f for _, f in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]
    assert reason in letter[b"reason"] and letter[b"source"] == stream.encode()
    assert dead_letter_count(redis_client) == 1


def test_copied_entries_leave_the_nodes_stream(redis_client):
    stream = protocol.node_metrics_stream("n1")
    for i in range(5):
        redis_client.xadd(stream, {"m": str(i)})
    fanin.fan_in(redis_client, "metrics")
    assert redis_client.xlen(stream) == 1  # only the last copied entry, which marks the cursor
    redis_client.xadd(stream, {"m": "5"})
    assert fanin.fan_in(redis_client, "metrics").copied == 1
    assert [f[b"m"] for _, f in redis_client.xrange(protocol.METRICS_STREAM)] == [str(i).encode() for i in range(6)]
