"""Fan-in: copy what each node wrote on its own streams onto the control plane's shared streams.

Every agent appends only to streams of its own node (``colony:node:<n>:events`` and
``:metrics``); its Redis user may touch nothing else. So a node that trims its stream to nothing,
exhausts its stream IDs or floods it hurts only itself: another node's exits are never lost with
it. The readers (agent events, metric ingest) keep consuming one shared stream each through a
consumer group, and call :func:`fan_in` first.

One Lua script per node stream moves its new entries, in order, and records how far it got, all
atomically: several readers may fan in at once and no entry is copied twice or skipped. Only the
``m`` and ``sig`` fields travel (the readers verify the signature as before); an entry with other
fields or a message too large to be valid is dead-lettered here with the reason instead. Copied
entries are trimmed from the node's stream, and a backlog a node built beyond
:data:`BACKLOG_CAP` (it flooded itself) is trimmed and counted, so one node cannot grow Redis
without bound between two fan-ins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from agents import protocol

log = logging.getLogger(__name__)

CURSORS_KEY = "colony:fanin:cursors"  # node stream -> id of the last entry copied
STATS_KEY = "colony:fanin:stats"
# Per node stream and call: a node cannot crowd out the others in one round.
PER_NODE = {"events": 500, "metrics": 200}
BACKLOG_CAP = 10_000

_SCRIPT = """
local cursor = redis.call('HGET', KEYS[3], KEYS[1])
if not cursor then cursor = '0-0' end
local entries = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', tonumber(ARGV[1]))
local copied, rejected = 0, 0
for _, entry in ipairs(entries) do
  local id, fields = entry[1], entry[2]
  local m, sig, other = nil, nil, nil
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 'm' then m = fields[i + 1]
    elseif name == 'sig' then sig = fields[i + 1]
    elseif other == nil then other = name end
  end
  local reason = nil
  if m == nil then reason = "missing field 'm'"
  elseif other ~= nil then reason = 'unexpected stream field: ' .. string.sub(other, 1, 64)
  elseif string.len(m) > tonumber(ARGV[3]) then
    reason = 'message of ' .. string.len(m) .. ' bytes exceeds ' .. ARGV[3]
  elseif sig ~= nil and string.len(sig) > 128 then reason = 'signature field too long' end
  if reason then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'source', KEYS[1], 'id', id, 'reason', reason,
               'raw', string.sub(m or '', 1, 1024))
    redis.call('INCR', KEYS[5])
    rejected = rejected + 1
  elseif sig ~= nil then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', tonumber(ARGV[2]), '*', 'm', m, 'sig', sig)
    copied = copied + 1
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', tonumber(ARGV[2]), '*', 'm', m)
    copied = copied + 1
  end
  cursor = id
end
if #entries > 0 then
  redis.call('HSET', KEYS[3], KEYS[1], cursor)
  redis.call('XTRIM', KEYS[1], 'MINID', cursor)
end
local dropped = 0
local length = redis.call('XLEN', KEYS[1])
if length > tonumber(ARGV[4]) + 1 then
  dropped = length - tonumber(ARGV[4]) - 1
  redis.call('XTRIM', KEYS[1], 'MAXLEN', tonumber(ARGV[4]) + 1)
end
return {copied, rejected, dropped}
"""


@dataclass
class FanInResult:
    copied: int = 0
    rejected: int = 0  # dead-lettered here (malformed entries)
    dropped: int = 0  # trimmed from a flooded node's backlog
    nodes: int = 0


def node_streams(client: redis.Redis, kind: str) -> list[str]:
    """Every node stream of ``kind`` ("events" or "metrics") in Redis, by name."""
    suffix = f":{kind}"
    found = []
    for key in client.scan_iter(match=f"colony:node:*{suffix}", count=10_000, _type="stream"):
        name = key.decode() if isinstance(key, bytes) else key
        node = name[len("colony:node:"):-len(suffix)]
        if protocol.NODE_NAME_RE.match(node):
            found.append(name)
    return sorted(found)


def fan_in(client: redis.Redis, kind: str) -> FanInResult:
    """Copy new entries of every node's ``kind`` stream onto the shared stream (one round trip
    to find the streams, one pipelined round trip to move them)."""
    shared = protocol.EVENTS_STREAM if kind == "events" else protocol.METRICS_STREAM
    streams = node_streams(client, kind)
    result = FanInResult(nodes=len(streams))
    if not streams:
        return result
    script = client.register_script(_SCRIPT)
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        script(keys=[stream, shared, CURSORS_KEY, protocol.DEAD_LETTER_STREAM, protocol.DEAD_LETTER_COUNT_KEY],
               args=[PER_NODE[kind], protocol.STREAM_MAXLEN, protocol.MAX_MESSAGE_BYTES, BACKLOG_CAP], client=pipe)
    for stream, (copied, rejected, dropped) in zip(streams, pipe.execute()):
        result.copied += copied
        result.rejected += rejected
        result.dropped += dropped
        if rejected or dropped:
            log.warning("%s: %d malformed entr(ies) dead-lettered, %d dropped from a backlog over %d",
                        stream, rejected, dropped, BACKLOG_CAP)
    if result.copied or result.rejected or result.dropped:
        pipe = client.pipeline(transaction=False)
        for field in ("copied", "rejected", "dropped"):
            pipe.hincrby(STATS_KEY, f"{kind}_{field}", getattr(result, field))
        pipe.execute()
    return result
