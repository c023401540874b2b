"""Fan-in: copy what each node wrote on its own streams onto the control plane's shared streams.

Every agent appends only to streams of its own node (``colony:node:<n>:events`` and
``:metrics``); its Redis user may touch nothing else. So a node that trims its stream to nothing,
exhausts its stream IDs or floods it hurts only itself: another node's exits are never lost with
it. The readers (agent events, metric ingest) keep consuming one shared stream each through a
consumer group, and call :func:`fan_in` first.

What a node writes is untrusted, and Redis runs one command at a time: nothing here makes Redis
walk a node's entries inside a script. A round (one :func:`fan_in` call) is four pipelined round
trips whatever the number of nodes (two more, and the round again for those nodes, only when some
node's cursor turns out to be past everything on its stream: 5 below):

1. size up every node stream: its cursor (``colony:fanin:cursors``, the id of the last entry
   copied), ``XLEN`` and ``MEMORY USAGE ... SAMPLES`` (cheap: a few allocation sizes, never the
   entries);
2. trim a backlog over :data:`BACKLOG_CAP` entries or :data:`BACKLOG_BYTES_CAP` bytes (oldest
   first, ``XTRIM MAXLEN``), and ``XRANGE`` what follows the cursor: at most :data:`PER_NODE`
   entries, fewer when the node's entries are heavy (about :data:`READ_BYTES` per node per round,
   a single entry when they average more than a valid one can weigh, or for :data:`HEAVY_FOR_S`
   after the node sent an entry with extra fields or bytes: ``MEMORY USAGE`` samples only the
   head of a long stream, so a node hiding heavy entries behind light ones is caught once, then
   throttled, ``colony:fanin:heavy``);
3. validate in Python: only the fields ``m`` (at most ``protocol.MAX_MESSAGE_BYTES``) and an
   optional ``sig`` (at most :data:`MAX_SIGNATURE_BYTES`); anything else is dead-lettered with its
   reason and a :data:`EXCERPT_BYTES` excerpt, at most :data:`DEAD_LETTERS_PER_NODE` per node
   per round (beyond that only counted, so one node cannot flush the dead-letter stream). An
   entry at the highest id (:data:`MAX_ID`) is refused too and deleted, and the cursor stops
   before it: a cursor there could never move again;
4. one tiny compare-and-set script per node, which sees only validated, bounded values: if the
   cursor is still the one read in 1, it copies the entries (in order), writes the dead letters,
   advances the cursor, counts, and deletes the copied entries from the node's stream (``MINID``
   and the last one). If another reader moved the cursor meanwhile, it does nothing: several
   readers may fan in at once and no entry is copied twice or skipped;
5. so an idle node's stream is empty, and a stream that holds entries while nothing follows its
   cursor is one whose cursor is past it: the stream was deleted and made again, or the node
   wrote ids ahead of the clock (or the highest id) and its streams were then deleted. Only for
   those nodes (one pipeline: the last entry of each) the cursor is reset when it is past that
   entry, with a compare-and-set, counted (``colony_fanin_cursor_resets{stream}``), logged with
   the node's name, and those nodes are read again in the same call. Every entry on a node's
   stream is one not yet copied, so reading it from the start again copies nothing twice.

What an operator sees, limits included:

- ``colony_fanin_cursor_resets{stream}``: node cursors found past their stream and reset (the
  ``ColonyStreamCursorReset`` alert); without the reset that node's events would never be read
  while its heartbeat keeps it UP.
- ``colony_fanin_entries{stream, outcome}`` on ``/metrics`` (``STATS_KEY``): ``copied``,
  ``rejected`` (malformed: dead-lettered or, past the per-round cap, only counted; all of them
  count in ``colony_dead_letters``) and ``dropped`` (trimmed unread from a backlog over a cap),
  and a warning in the log naming the node stream.
- A node writing huge or many-field entries (the 50,000-field attack) gets one of them read per
  round and dead-lettered; Redis stays responsive for everyone else (no script ever runs over
  untrusted data), and only that node's own messages are delayed.
- A node's backlog is capped at :data:`BACKLOG_CAP` entries and about :data:`BACKLOG_BYTES_CAP`
  bytes (estimated by ``MEMORY USAGE``); beyond that the oldest unread entries are dropped and
  counted. The Redis servers Colony starts (``cluster_ui/devstack``, compose) also refuse any
  single value over 1 MiB (``proto-max-bulk-len``) and a query buffer over 2 MiB.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from agents import protocol

log = logging.getLogger(__name__)

CURSORS_KEY = "colony:fanin:cursors"  # node stream -> id of the last entry copied (or refused)
STATS_KEY = "colony:fanin:stats"
# node stream -> unix time until which it is read one entry a round (it sent a heavy entry).
HEAVY_KEY = "colony:fanin:heavy"
HEAVY_FOR_S = 600
# Per node stream and round: a node cannot crowd out the others, or make one round slow.
PER_NODE = {"events": 32, "metrics": 32, "logs": 32}
# The shared stream each kind is copied onto.
SHARED = {"events": protocol.EVENTS_STREAM, "metrics": protocol.METRICS_STREAM, "logs": protocol.LOGS_STREAM}
# Live output is a tail, not a record: the shared logs stream keeps fewer entries.
SHARED_MAXLEN = {"logs": 10_000}
# A node's backlog (unread entries) beyond these is dropped, oldest first, and counted.
BACKLOG_CAP = 10_000
BACKLOG_BYTES_CAP = 32 * 1024 * 1024
# Below this many entries MEMORY USAGE is exact anyway (it samples every node of the stream), so
# a short stream is measured every round; a long one is what the byte cap is for.
SAMPLES = 33
# About this much is read from one node stream per round.
READ_BYTES = 1024 * 1024
MAX_SIGNATURE_BYTES = 128
# An entry averaging more than this cannot be valid (a message, its signature and the overhead):
# read such a stream one entry per round.
MAX_VALID_ENTRY_BYTES = 2 * protocol.MAX_MESSAGE_BYTES
DEAD_LETTERS_PER_NODE = 4
EXCERPT_BYTES = 256
MAX_ID = b"18446744073709551615-18446744073709551615"

# Sees only what Python validated: bounded ``m``/``sig`` values and short dead-letter records.
# KEYS: node stream, shared stream, cursors, dead-letter stream, dead-letter count, stats.
# ARGV: expected cursor ('' = none yet), new cursor ('' = none yet), #copies, #letters, #rejected,
#       kind, shared stream MAXLEN, an entry id to delete ('' = none: the refused MAX_ID), then per
#       copy (m, has_sig, sig), then per letter (id, reason, raw).
_CAS = """
local current = redis.call('HGET', KEYS[3], KEYS[1])
if not current then current = '' end
if current ~= ARGV[1] then return -1 end
local copies, letters, rejected = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local maxlen = tonumber(ARGV[7])
local at = 9
for _ = 1, copies do
  if ARGV[at + 1] == '1' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'm', ARGV[at], 'sig', ARGV[at + 2])
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'm', ARGV[at])
  end
  at = at + 3
end
for _ = 1, letters do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'source', KEYS[1], 'id', ARGV[at],
             'reason', ARGV[at + 1], 'raw', ARGV[at + 2])
  at = at + 3
end
if rejected > 0 then
  redis.call('INCRBY', KEYS[5], rejected)
  redis.call('HINCRBY', KEYS[6], ARGV[6] .. '_rejected', rejected)
end
if copies > 0 then redis.call('HINCRBY', KEYS[6], ARGV[6] .. '_copied', copies) end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[3], KEYS[1], ARGV[2])
  -- Everything up to the cursor goes: what stays on a node's stream is never copied yet.
  redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
  redis.call('XDEL', KEYS[1], ARGV[2])
end
if ARGV[8] ~= '' then redis.call('XDEL', KEYS[1], ARGV[8]) end
return copies
"""

# A node stream holds entries but nothing after its cursor (Python saw its last entry at or below
# the cursor). KEYS: node stream, cursors, stats. ARGV: expected cursor, kind.
# Returns -1 (another reader moved the cursor), 0 (nothing but an earlier Colony's marker of the
# cursor, now deleted) or 1 (reset: the stream is read from its start again).
_RESET = """
if redis.call('HGET', KEYS[2], KEYS[1]) ~= ARGV[1] then return -1 end
-- Earlier versions kept the last copied entry to mark the cursor; it was copied.
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('XLEN', KEYS[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], KEYS[1])
redis.call('HINCRBY', KEYS[3], ARGV[2] .. '_cursor_resets', 1)
return 1
"""


@dataclass
class FanInResult:
    copied: int = 0
    rejected: int = 0  # malformed entries: dead-lettered here (or, past the cap, only counted)
    dropped: int = 0  # trimmed unread from a node's backlog over a cap
    nodes: int = 0
    cursor_resets: int = 0  # node cursors found past everything on their stream, and reset


def node_streams(client: redis.Redis, kind: str) -> list[str]:
    """Every node stream of ``kind`` ("events", "metrics" or "logs") in Redis, by name."""
    suffix = f":{kind}"
    found = []
    for key in client.scan_iter(match=f"colony:node:*{suffix}", count=10_000, _type="stream"):
        name = key.decode() if isinstance(key, bytes) else key
        node = name[len("colony:node:"):-len(suffix)]
        if protocol.NODE_NAME_RE.match(node):
            found.append(name)
    return sorted(found)


def problem(fields: dict) -> str | None:
    """Why an entry of a node stream may not be copied (None: it may)."""
    m = fields.get(b"m")
    if m is None:
        return "missing field 'm'"
    others = [name for name in fields if name not in (b"m", b"sig")]
    if others:
        name = others[0][:64].decode("utf-8", "replace")
        return f"unexpected stream field: {name} ({len(fields)} fields)"
    if len(m) > protocol.MAX_MESSAGE_BYTES:
        return f"message of {len(m)} bytes exceeds {protocol.MAX_MESSAGE_BYTES}"
    sig = fields.get(b"sig")
    if sig is not None and len(sig) > MAX_SIGNATURE_BYTES:
        return f"signature field of {len(sig)} bytes exceeds {MAX_SIGNATURE_BYTES}"
    return None


def read_count(kind: str, length: int, usage: int | None, heavy: bool = False) -> int:
    """How many entries to read from a node stream of ``length`` entries using ``usage`` bytes
    (``heavy``: it sent an entry no valid message could make lately)."""
    if heavy:
        return 1
    if not usage or length <= 0:
        return PER_NODE[kind]
    per_entry = usage / length
    if per_entry > MAX_VALID_ENTRY_BYTES:
        return 1
    return max(1, min(PER_NODE[kind], int(READ_BYTES // per_entry)))


def _backlog_trim(length: int, usage: int | None) -> int | None:
    """The MAXLEN to trim a node stream to, or None when it is within both caps."""
    keep = length
    if length > BACKLOG_CAP + 1:
        keep = BACKLOG_CAP + 1  # the +1: the entry marking the cursor
    if usage and usage > BACKLOG_BYTES_CAP and length:
        # Keep about half the byte cap's worth of the newest entries.
        keep = min(keep, int(length * (BACKLOG_BYTES_CAP // 2) / usage))
    return keep if keep < length else None


def _stream_id(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def _node_of(stream: str) -> str:
    return stream[len("colony:node:"):].rsplit(":", 1)[0]


def fan_in(client: redis.Redis, kind: str) -> FanInResult:
    """Copy new entries of every node's ``kind`` stream onto the shared stream (see the module
    docstring: a SCAN for the streams, then four pipelined round trips)."""
    streams = node_streams(client, kind)
    result = FanInResult(nodes=len(streams))
    if not streams:
        return result
    behind = _round(client, kind, streams, result)
    if behind:
        reset = _reset_cursors(client, kind, behind, result)
        if reset:
            # Read them now: their entries have waited long enough (a job placed there is PLACED).
            _round(client, kind, reset, result)
    return result


def _round(client: redis.Redis, kind: str, streams: list[str], result: FanInResult) -> list[tuple[str, bytes]]:
    """Steps 1-4 of the module docstring for ``streams``, adding to ``result``. Returns the
    (stream, cursor) of the streams that hold entries while nothing followed their cursor."""
    shared = SHARED[kind]

    # 1. Cursors, lengths and sizes (never the entries themselves).
    pipe = client.pipeline(transaction=False)
    pipe.hmget(CURSORS_KEY, streams)
    pipe.hmget(HEAVY_KEY, streams)
    for stream in streams:
        pipe.xlen(stream)
        pipe.memory_usage(stream, samples=SAMPLES)
    replies = pipe.execute(raise_on_error=False)
    cursors = replies[0] if isinstance(replies[0], list) else [None] * len(streams)
    now = time.time()
    heavy = [bool(until) and float(until) > now for until in
             (replies[1] if isinstance(replies[1], list) else [None] * len(streams))]
    sizes = [(r if isinstance(r, int) else 0, u if isinstance(u, int) else None)
             for r, u in zip(replies[2::2], replies[3::2])]

    # 2. Trim backlogs over a cap, then read a bounded share of what follows each cursor.
    pipe = client.pipeline(transaction=False)
    plan = []  # (stream, cursor, length, trimmed?, read?)
    for stream, cursor, (length, usage), slow in zip(streams, cursors, sizes, heavy):
        keep = _backlog_trim(length, usage)
        if keep is not None:
            pipe.xtrim(stream, maxlen=keep, approximate=False)
        reading = cursor != MAX_ID  # nothing can follow the highest id
        if reading:
            start = b"(" + cursor if cursor else b"-"
            pipe.xrange(stream, min=start, max="+", count=read_count(kind, length, usage, slow))
        plan.append((stream, cursor, length, keep is not None, reading))
    replies = iter(pipe.execute(raise_on_error=False))

    # 3. Validate in Python; 4. copy and advance each cursor in one compare-and-set.
    script = client.register_script(_CAS)
    pipe = client.pipeline(transaction=False)
    dropped_by_stream = {}
    heavy_now = set()
    sent = []
    behind = []
    for stream, cursor, length, trimmed, reading in plan:
        if trimmed:
            dropped = next(replies)
            if isinstance(dropped, int) and dropped:
                dropped_by_stream[stream] = dropped
        entries = next(replies) if reading else []
        if isinstance(entries, Exception):
            log.warning("%s: cannot read past %s: %s", stream, cursor, entries)
            continue
        if not entries:
            # Copied entries leave the stream, so an idle node's is empty: one holding entries
            # none of which follow the cursor may have its cursor past them (5.).
            if length and cursor:
                behind.append((stream, cursor))
            continue
        copies, letters, rejected = [], [], 0
        last, refused = entries[-1][0], b""
        for entry_id, fields in entries:
            if len(fields) > 2 or sum(map(len, fields.values())) > protocol.MAX_MESSAGE_BYTES + MAX_SIGNATURE_BYTES:
                # No valid entry is this heavy: read this node one entry a round for a while
                # (MEMORY USAGE only samples the head of a long stream; this catches the rest).
                heavy_now.add(stream)
            if entry_id == MAX_ID:
                # Nothing can follow it: a cursor there would never move again. It is the last
                # entry there can be, so the cursor stops at the one before (or stays).
                reason = "entry id at the highest there is: the node exhausted its stream ids"
                refused = entry_id
                last = entries[-2][0] if len(entries) > 1 else (cursor or b"")
            else:
                reason = problem(fields)
            if reason is None:
                sig = fields.get(b"sig")
                copies += [fields[b"m"], "1" if sig is not None else "0", sig or b""]
                continue
            rejected += 1
            if rejected <= DEAD_LETTERS_PER_NODE:
                raw = (fields.get(b"m") or b"")[:EXCERPT_BYTES]
                letters += [entry_id, reason[:500], raw]
        script(keys=[stream, shared, CURSORS_KEY, protocol.DEAD_LETTER_STREAM, protocol.DEAD_LETTER_COUNT_KEY,
                     STATS_KEY],
               args=[cursor or b"", last, len(copies) // 3, len(letters) // 3, rejected, kind,
                     SHARED_MAXLEN.get(kind, protocol.STREAM_MAXLEN), refused, *copies, *letters], client=pipe)
        sent.append((stream, rejected))
    for stream, dropped in dropped_by_stream.items():
        pipe.hincrby(STATS_KEY, f"{kind}_dropped", dropped)
        result.dropped += dropped
    for stream in heavy_now:
        pipe.hset(HEAVY_KEY, stream, now + HEAVY_FOR_S)
    if not sent and not dropped_by_stream:
        return behind
    outcomes = pipe.execute(raise_on_error=False)
    for (stream, rejected), copied in zip(sent, outcomes):
        if isinstance(copied, Exception):
            log.warning("%s: fan-in failed: %s", stream, copied)
        elif copied >= 0:  # -1: another reader moved the cursor first and copied these
            result.copied += copied
            result.rejected += rejected
            if rejected:
                log.warning("%s: %d malformed entr(ies) dead-lettered (at most %d a round recorded)",
                            stream, rejected, DEAD_LETTERS_PER_NODE)
    for stream, dropped in dropped_by_stream.items():
        log.warning("%s: %d unread entr(ies) dropped from a backlog over %d entries or %d bytes",
                    stream, dropped, BACKLOG_CAP, BACKLOG_BYTES_CAP)
    return behind


def _reset_cursors(client: redis.Redis, kind: str, behind: list[tuple[str, bytes]], result: FanInResult) -> list[str]:
    """Step 5: reset the cursors of ``behind`` found past the last entry of their stream, adding
    to ``result``; returns the streams reset. Two pipelined round trips, for these nodes only."""
    pipe = client.pipeline(transaction=False)
    for stream, _cursor in behind:
        pipe.xrevrange(stream, count=1)
    replies = pipe.execute(raise_on_error=False)
    script = client.register_script(_RESET)
    pipe = client.pipeline(transaction=False)
    checked = []
    for (stream, cursor), newest in zip(behind, replies):
        if not isinstance(newest, list) or not newest:
            continue  # gone meanwhile (or unreadable): the next round looks again
        last = newest[0][0]
        if _stream_id(last) > _stream_id(cursor):
            continue  # written since the read: the next round reads it
        script(keys=[stream, CURSORS_KEY, STATS_KEY], args=[cursor, kind], client=pipe)
        checked.append((stream, cursor, last))
    if not checked:
        return []
    reset = []
    for (stream, cursor, last), outcome in zip(checked, pipe.execute(raise_on_error=False)):
        if isinstance(outcome, Exception):
            log.warning("%s: cannot reset its cursor %s: %s", stream, cursor, outcome)
        elif outcome == 1:
            result.cursor_resets += 1
            reset.append(stream)
            log.warning("node %s: fan-in cursor %s of %s was past the stream's last entry %s (the stream was "
                        "deleted and made again, or the node wrote ids ahead of the clock); reading it from "
                        "its start again", _node_of(stream), cursor.decode(), stream, last.decode())
    return reset
