"""Nodes write only their own streams; the control plane fans them in. What one node does to its
own stream (trim it to nothing, exhaust its IDs, flood it, write garbage, entries of 50,000
fields, megabytes of them) never costs another node an event nor blocks Redis, and nothing is
copied twice however many readers fan in at once."""

import threading
import time

import pytest
import redis as redis_lib

from agents import protocol, signing
from cluster_ui.devstack.redis_server import PrivateRedis, redis_server_version, supports_acl_selectors
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from monitoring.services import fanin
from agents.streams import dead_letter_count
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

    def reader():
        for _ in range(3):
            fanin.fan_in(redis_client, "events")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while fanin.fan_in(redis_client, "events").copied:  # a round moves at most PER_NODE a node
        pass
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
    assert redis_client.xlen(stream) == 0  # the last one too: what stays is never copied yet
    redis_client.xadd(stream, {"m": "5"})
    assert fanin.fan_in(redis_client, "metrics").copied == 1
    assert [f[b"m"] for _, f in redis_client.xrange(protocol.METRICS_STREAM)] == [str(i).encode() for i in range(6)]


def test_a_round_copies_a_bounded_share_of_each_node_and_the_rest_next_time(redis_client):
    stream = protocol.node_events_stream("n1")
    for i in range(fanin.PER_NODE["events"] + 5):
        redis_client.xadd(stream, {"m": str(i)})
    assert fanin.fan_in(redis_client, "events").copied == fanin.PER_NODE["events"]
    assert fanin.fan_in(redis_client, "events").copied == 5
    assert [int(f[b"m"]) for _, f in redis_client.xrange(protocol.EVENTS_STREAM)] == list(range(37))
    stats = redis_client.hgetall(fanin.STATS_KEY)
    assert int(stats[b"events_copied"]) == 37


def _many_fields(client, stream, entries, fields=50_000):
    """``entries`` entries of ``fields`` fields each. The XADD is encoded once and sent ``entries``
    times (a pipeline of XADDs encoded them one by one: 4.6 s of this test's 9, now 0.5 s)."""
    connection = client.connection_pool.get_connection()
    try:
        xadd = connection.pack_command("XADD", stream, "*", "m", "{}",
                                       *[word for i in range(fields) for word in (f"f{i}", "1")])
        for _ in range(entries):
            connection.send_packed_command(xadd, check_health=False)
        for _ in range(entries):
            connection.read_response()
    finally:
        client.connection_pool.release(connection)


def test_entries_of_50000_fields_are_dead_lettered_without_blocking_redis(redis_client, redis_url):
    """The old fan-in walked these inside one Lua script: Redis answered nobody for over a second
    (BUSY past busy-reply-threshold). Now Redis never runs anything long; the node waits alone."""
    evil, good = protocol.node_events_stream("evil"), protocol.node_events_stream("good")
    _many_fields(redis_client, evil, 48)
    redis_client.xadd(good, {"m": "ok", "sig": "s"})
    latencies, errors, done = [], [], threading.Event()

    def other_client():  # another node's heartbeat, say
        client = redis_lib.Redis.from_url(redis_url)
        while not done.is_set():
            started = time.perf_counter()
            try:
                client.ping()
            except redis_lib.RedisError as exc:
                errors.append(exc)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.002)

    redis_client.config_set("slowlog-log-slower-than", 50_000)  # microseconds
    redis_client.slowlog_reset()
    pinger = threading.Thread(target=other_client)
    pinger.start()
    try:
        time.sleep(0.05)
        started = time.perf_counter()
        result = fanin.fan_in(redis_client, "events")
        elapsed = time.perf_counter() - started
        time.sleep(0.02)
    finally:
        done.set()
        pinger.join()
        slow = redis_client.slowlog_get(10)
        redis_client.config_set("slowlog-log-slower-than", 10_000)
    # Redis itself ran nothing for 50 ms (the old script: over 500 ms); the other client, which
    # shares this process (and its GIL) with the fan-in, got every answer in time.
    assert not slow, [(entry["duration"], entry["command"][:40]) for entry in slow]
    # (Wall-clock bounds, wide enough for a loaded 2-core CI machine: 1.08 s was seen there for a
    # fan-in that takes ~0.2 s on a quiet one. The slowlog above is the exact check.)
    assert not errors and max(latencies) < 0.5, (max(latencies), errors)
    assert elapsed < 3.0
    # Heavy entries are read one a round; the other node's entry is copied in the same round.
    assert (result.copied, result.rejected) == (1, 1)
    (letter,) = [f for _, f in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]
    assert letter[b"reason"].startswith(b"unexpected stream field: f0") and letter[b"raw"] == b"{}"
    assert redis_client.xlen(evil) == 47  # the one dead-lettered left; 47 to come
    assert fanin.fan_in(redis_client, "events").rejected == 1


def test_dead_letters_per_node_and_round_are_capped_the_rest_only_counted(redis_client):
    stream = protocol.node_events_stream("n1")
    for i in range(20):
        redis_client.xadd(stream, {"m": "x" * 1000, "junk": str(i)} if i % 2 else {"m": "y" * 1000, "sig": "s" * 129})
    redis_client.xadd(stream, {"m": "next"})
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.rejected) == (1, 20)
    letters = [f for _, f in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]
    assert len(letters) == fanin.DEAD_LETTERS_PER_NODE
    assert all(len(letter[b"raw"]) <= fanin.EXCERPT_BYTES for letter in letters)
    assert dead_letter_count(redis_client) == 20
    assert int(redis_client.hget(fanin.STATS_KEY, "events_rejected")) == 20
    assert [f for _, f in redis_client.xrange(protocol.EVENTS_STREAM)] == [{b"m": b"next"}]


def test_a_backlog_heavy_in_bytes_is_trimmed_and_counted(redis_client, monkeypatch):
    monkeypatch.setattr(fanin, "BACKLOG_BYTES_CAP", 2 * 1024 * 1024)
    heavy, light = protocol.node_metrics_stream("heavy"), protocol.node_metrics_stream("light")
    pipe = redis_client.pipeline(transaction=False)
    for i in range(100):  # 100 valid-sized entries of 60 KB: about 6 MB
        pipe.xadd(heavy, {"m": f"{i:03d}" + "x" * 60_000})
    pipe.execute()
    redis_client.xadd(light, {"m": "light"})
    result = fanin.fan_in(redis_client, "metrics")
    assert result.dropped > 50
    assert int(redis_client.hget(fanin.STATS_KEY, "metrics_dropped")) == result.dropped
    # The newest entries are kept and copied in order; the light node is untouched.
    copied = [f[b"m"] for _, f in redis_client.xrange(protocol.METRICS_STREAM)]
    assert b"light" in copied
    numbers = [int(m[:3]) for m in copied if m != b"light"]
    assert numbers == sorted(numbers) and numbers[0] == result.dropped
    while fanin.fan_in(redis_client, "metrics").copied:
        pass
    assert redis_client.memory_usage(heavy) < fanin.BACKLOG_BYTES_CAP
    assert redis_client.xlen(protocol.METRICS_STREAM) == 101 - result.dropped


def test_the_redis_colony_starts_refuses_values_over_a_mebibyte(tmp_path):
    """One node's agent cannot park 64 MiB in its stream or heartbeat (the compose Redis gets the
    same limits: tests/test_compose_secrets.py)."""
    version = redis_server_version()
    node_password = signing.redis_password(SECRET, "n1")
    users = {signing.redis_user("n1"): signing.redis_acl_rules("n1", node_password)} \
        if supports_acl_selectors(version) else {}
    with PrivateRedis(tmp_path / "redis", password="admin-password", acl_users=users) as server:
        admin = redis_lib.Redis.from_url(server.url)
        node = redis_lib.Redis.from_url(server.user_url(signing.redis_user("n1"), node_password)) \
            if users else admin
        node.xadd(protocol.node_events_stream("n1"), {"m": b"x" * (512 * 1024)})
        with pytest.raises(redis_lib.RedisError):
            node.xadd(protocol.node_events_stream("n1"), {"m": b"x" * (2 * 1024 * 1024)})
        with pytest.raises(redis_lib.RedisError):
            node.set(protocol.heartbeat_key("n1"), b"x" * (2 * 1024 * 1024), ex=100)
        assert admin.xlen(protocol.node_events_stream("n1")) == 1
        assert not admin.exists(protocol.heartbeat_key("n1"))
        assert admin.config_get("proto-max-bulk-len")["proto-max-bulk-len"] == str(1024 * 1024)


def test_a_node_that_sent_a_heavy_entry_is_read_one_entry_a_round_for_a_while(redis_client):
    stream = protocol.node_events_stream("n1")
    for i in range(3):
        redis_client.xadd(stream, {"m": "{}", "a": "1", "b": "2"})
    for i in range(100):
        redis_client.xadd(stream, {"m": str(i)})
    assert fanin.fan_in(redis_client, "events").rejected == 3
    assert fanin.fan_in(redis_client, "events").copied == 1
    redis_client.hset(fanin.HEAVY_KEY, stream, time.time() - 1)  # the while is over
    assert fanin.fan_in(redis_client, "events").copied == fanin.PER_NODE["events"]
    other = protocol.node_events_stream("n2")
    redis_client.xadd(other, {"m": "x" * 1000})
    assert fanin.fan_in(redis_client, "events").copied == fanin.PER_NODE["events"] + 1  # light: untouched
