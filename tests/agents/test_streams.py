"""The stream plumbing both ends share (``agents.streams``): groups made once however often asked,
what a dead reader left claimed on Redis 6.2's and 7's XAUTOCLAIM replies alike, and dead letters
that keep the reason and are counted."""

from __future__ import annotations

from agents import protocol, streams


def test_a_group_is_made_once_and_reads_what_was_added_after_it(redis_client):
    streams.ensure_group(redis_client, "s", "g")
    streams.ensure_group(redis_client, "s", "g")  # BUSYGROUP is not an error
    redis_client.xadd("s", {"m": "1"})
    assert [fields for _, fields in streams.read_new(redis_client, "s", "g", "c1", 10)] == [{b"m": b"1"}]
    assert streams.read_new(redis_client, "s", "g", "c1", 10) == []


def test_what_a_dead_reader_left_pending_is_claimed(redis_client):
    streams.ensure_group(redis_client, "s", "g")
    for i in range(5):
        redis_client.xadd("s", {"m": str(i)})
    streams.read_new(redis_client, "s", "g", "dead", 10)  # read, never acked
    claimed = streams.claim_stale(redis_client, "s", "g", "alive", 0, count=2)
    assert [fields[b"m"] for _, fields in claimed] == [b"0", b"1", b"2", b"3", b"4"]


class Replies:
    """XAUTOCLAIM as each Redis answers it: 6.2 with (cursor, entries), 7 with a third item (ids
    of entries deleted meanwhile)."""

    def __init__(self, pages, version):
        self.pages, self.version = list(pages), version

    def xautoclaim(self, stream, group, consumer, min_idle, cursor, count):
        cursor, entries = self.pages.pop(0)
        return [cursor, entries] if self.version == 6 else [cursor, entries, []]


def test_claiming_reads_both_reply_shapes_to_the_end():
    pages = [(b"5-0", [(b"1-0", {b"m": b"a"})]), (b"0-0", [(b"6-0", {b"m": b"b"})])]
    for version in (6, 7):
        claimed = streams.claim_stale(Replies(pages, version), "s", "g", "c", 0)
        assert [entry_id for entry_id, _ in claimed] == [b"1-0", b"6-0"], version


def test_a_dead_letter_keeps_the_reason_a_bounded_excerpt_and_is_counted(redis_client):
    streams.dead_letter(redis_client, "colony:events", b"7-0", {b"m": b"x" * 5000}, "not JSON")
    [(_, letter)] = redis_client.xrange(protocol.DEAD_LETTER_STREAM)
    assert letter[b"reason"] == b"not JSON" and len(letter[b"raw"]) == streams.RAW_BYTES_KEPT
    assert streams.dead_letter_count(redis_client) == 1
