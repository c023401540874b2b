"""A node whose fan-in cursor ended up past everything on its stream (the stream deleted and made
again after the node wrote ids ahead of the clock, or the highest id there is) is read again: the
cursor is reset, counted (``colony_fanin_cursor_resets_total``) and logged with the node's name,
and the new entries are copied in the same fan-in call. Other nodes are untouched, an idle node
costs no extra command, and an entry at the highest id is refused before a cursor can reach it."""

import logging
import time

import pytest

from agents import protocol
from cluster_ui.devstack.redis_server import redis_server_version
from jobs.choices import JobState
from jobs.services.agent_events import consume_events
from monitoring.services import fanin
from tests.cluster_ui.test_metrics_endpoint import scrape
from tests.monitoring.test_fanin import SECRET, exited, running_on, write

# An id some 3,000 years ahead of the clock: the node (a broken agent, a restored snapshot) set it.
AHEAD = "99999999999999-0"


@pytest.fixture
def signed_events(settings, db, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


def resets(client, kind="events") -> int:
    return int(client.hget(fanin.STATS_KEY, f"{kind}_cursor_resets") or 0)


def cursor(client, stream) -> bytes | None:
    return client.hget(fanin.CURSORS_KEY, stream)


def test_a_node_whose_stream_was_made_again_below_its_cursor_is_read_after_one_reset(signed_events, redis_client,
                                                                                    caplog):
    stuck, bystander = running_on("node-b"), running_on("node-a")
    mine = protocol.node_events_stream("node-b")
    redis_client.xadd(mine, {"m": "{}"}, id=AHEAD)
    consume_events(redis_client)
    assert cursor(redis_client, mine) == AHEAD.encode()
    # The operator deletes the node's streams; its agent starts again and reports an exit.
    redis_client.delete(mine)
    write(redis_client, "node-b", exited("node-b", stuck))
    write(redis_client, "node-a", exited("node-a", bystander))
    with caplog.at_level(logging.WARNING, logger=fanin.__name__):
        consume_events(redis_client)  # one pass: the cursor is reset and the exit read
    stuck.refresh_from_db()
    bystander.refresh_from_db()
    assert (stuck.state, bystander.state) == (JobState.SUCCEEDED, JobState.SUCCEEDED)
    assert resets(redis_client) == 1
    assert [r.levelno for r in caplog.records if "node-b" in r.getMessage() and "cursor" in r.getMessage()] \
        == [logging.WARNING]
    assert not any("node-a" in r.getMessage() for r in caplog.records)
    # Read from then on like any node; nothing is reset again.
    redis_client.xadd(mine, {"m": "{}"})
    assert (fanin.fan_in(redis_client, "events").copied, resets(redis_client)) == (1, 1)


def test_an_entry_at_the_highest_id_is_refused_and_the_node_read_once_its_stream_is_made_again(signed_events,
                                                                                             redis_client):
    job = running_on("node-b")
    mine = protocol.node_events_stream("node-b")
    redis_client.xadd(mine, {"m": "{}"})
    redis_client.xadd(mine, {"m": "{}"}, id=fanin.MAX_ID)
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.rejected) == (1, 1)
    assert cursor(redis_client, mine) != fanin.MAX_ID
    (letter,) = [f for _, f in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]
    assert letter[b"id"] == fanin.MAX_ID and b"highest" in letter[b"reason"]
    assert redis_client.xlen(mine) == 0  # dropped: it is not read again every round
    redis_client.delete(mine)
    write(redis_client, "node-b", exited("node-b", job))
    consume_events(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


@pytest.mark.parametrize("kind", ["events", "metrics"])
def test_a_cursor_left_at_the_highest_id_is_reset_and_the_new_entries_copied(redis_client, kind):
    """As an earlier Colony left it: the cursor at the highest id, which nothing can follow."""
    stream = f"colony:node:node-b:{kind}"
    other = f"colony:node:node-a:{kind}"
    redis_client.hset(fanin.CURSORS_KEY, stream, fanin.MAX_ID)
    redis_client.xadd(stream, {"m": "after"})
    redis_client.xadd(other, {"m": "other"})
    result = fanin.fan_in(redis_client, kind)
    assert (result.copied, result.cursor_resets) == (2, 1)
    assert sorted(f[b"m"] for _, f in redis_client.xrange(fanin.SHARED[kind])) == [b"after", b"other"]
    assert resets(redis_client, kind) == 1
    assert cursor(redis_client, stream) not in (None, fanin.MAX_ID)


def test_a_marker_left_by_an_earlier_colony_is_dropped_without_a_reset(redis_client):
    """Earlier versions kept the last copied entry on the node's stream to mark the cursor."""
    stream = protocol.node_events_stream("node-a")
    marker = redis_client.xadd(stream, {"m": "copied long ago"})
    redis_client.hset(fanin.CURSORS_KEY, stream, marker)
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.cursor_resets) == (0, 0)
    assert redis_client.xlen(stream) == 0 and cursor(redis_client, stream) == marker
    assert redis_client.xlen(protocol.EVENTS_STREAM) == 0


def test_entries_below_an_old_marker_are_read_after_a_reset(redis_client):
    stream = protocol.node_events_stream("node-b")
    redis_client.xadd(stream, {"m": "copied"}, id=AHEAD)
    redis_client.hset(fanin.CURSORS_KEY, stream, AHEAD)
    redis_client.delete(stream)
    redis_client.xadd(stream, {"m": "new"})
    redis_client.xadd(stream, {"m": "copied"}, id=AHEAD)  # a marker, as an earlier Colony kept one
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.cursor_resets) == (1, 1)
    assert [f[b"m"] for _, f in redis_client.xrange(protocol.EVENTS_STREAM)] == [b"new"]


@pytest.mark.skipif(redis_server_version() < (7, 0), reason="per-command stats as Redis 7 reports them")
def test_idle_nodes_cost_no_check_of_their_cursor(redis_client):
    streams = [protocol.node_metrics_stream(f"n{i}") for i in range(50)]
    for stream in streams:
        redis_client.xadd(stream, {"m": "{}"})
    assert fanin.fan_in(redis_client, "metrics").copied == 50
    assert all(redis_client.xlen(s) == 0 for s in streams)  # copied entries leave the node's stream
    redis_client.config_resetstat()
    for _ in range(3):
        assert fanin.fan_in(redis_client, "metrics").cursor_resets == 0
    stats = redis_client.info("commandstats")
    assert "cmdstat_xrevrange" not in stats and "cmdstat_evalsha" not in stats
    assert resets(redis_client, "metrics") == 0


def test_entries_written_after_the_cursor_are_read_without_a_reset(redis_client):
    stream = protocol.node_events_stream("n1")
    redis_client.xadd(stream, {"m": "1"})
    fanin.fan_in(redis_client, "events")
    redis_client.delete(stream)  # deleted and made again, but below nothing: ids follow the clock
    time.sleep(0.002)
    redis_client.xadd(stream, {"m": "2"})
    result = fanin.fan_in(redis_client, "events")
    assert (result.copied, result.cursor_resets) == (1, 0)


def test_metrics_export_cursor_resets(client, db, live_redis, redis_client, settings):
    settings.COLONY_METRICS_TOKEN = ""
    stream = protocol.node_events_stream("node-b")
    redis_client.hset(fanin.CURSORS_KEY, stream, AHEAD)
    redis_client.xadd(stream, {"m": "{}"})
    fanin.fan_in(redis_client, "events")
    _, families = scrape(client)
    by_stream = {s.labels["stream"]: s.value for s in families["colony_fanin_cursor_resets"].samples}
    assert by_stream == {"events": 1, "metrics": 0, "logs": 0}
