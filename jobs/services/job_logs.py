"""Live job output: chunks the nodes ship (``JobOutput``) -> a bounded Redis stream per job and node.

Each agent appends the new bytes of its running jobs' ``output.log`` to its own logs stream
(``colony:node:<n>:logs``); :func:`consume_logs` fans them in onto ``colony:logs``
(:func:`monitoring.services.fanin.fan_in`, kind "logs") and reads that through a consumer group.
Every entry is parsed (``agents.protocol.decode_output``), authenticated against the node it
names, and refused (dead-lettered with the reason) unless that node holds the job, or released it
moments ago (``monitoring.services.placements``): a node's key speaks only for its own jobs.

What is kept, per job and node, is ``colony:job:<id>:log:<node>``: a stream of chunks (fields
``l`` launch id, ``o`` offset in the node's output.log, ``g`` "1" when output before it was passed
over, ``d`` the text), trimmed oldest first to :data:`LOG_BYTES_CAP` bytes of text and
:data:`LOG_MAX_ENTRIES` entries, and the hash ``colony:job:<id>:log`` (per node: its bytes, the
launch and end offset of its last chunk, which drops a chunk sent twice). Both expire
:data:`LOG_TTL_S` after the job's last output. The database never holds live output: a finished
job keeps its ``output_tail`` as before.

Nothing here changes a job's state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from agents import protocol
from agents.streams import dead_letter, drain
from monitoring.services import placements
from monitoring.services.fanin import fan_in
from monitoring.services.poison import parse_or_dead_letter
from monitoring.services.redis_client import get_redis
from monitoring.services.registry import agent_auth_required

log = logging.getLogger(__name__)

GROUP = "control-plane"
CLAIM_IDLE_MS = 30_000
BATCH = 200
# Per job and node: about this much text, and at most this many chunks (sparse output makes
# many small ones), are kept; a job printing 10 MB keeps the last 256 KiB.
LOG_BYTES_CAP = 256 * 1024
LOG_MAX_ENTRIES = 2048
# Kept this long after the job's last output (so a while after it ends).
LOG_TTL_S = 24 * 3600
# Fan-in rounds per call (each moves at most fanin.PER_NODE["logs"] entries a node): a node with
# more running jobs than that ships more chunks an interval than one round moves.
FAN_IN_ROUNDS = 4
# Chunks one API call returns at most.
READ_LIMIT = 256

# Stores one validated chunk: our own entries only, each bounded, so trimming here walks at most
# a few entries we wrote. KEYS: job-node stream, job index hash.
# ARGV: node, launch ('' = none), offset, length, gap ('1'/'0'), text, byte cap, entry cap, ttl.
_STORE = """
local lkey, ekey, bkey = ARGV[1] .. ':launch', ARGV[1] .. ':end', ARGV[1] .. ':bytes'
local offset, length = tonumber(ARGV[3]), tonumber(ARGV[4])
local launch = redis.call('HGET', KEYS[2], lkey)
local stored_end = tonumber(redis.call('HGET', KEYS[2], ekey) or '-1')
local gap = ARGV[5]
if launch == ARGV[2] then
  if gap == '0' and offset + length <= stored_end then return 0 end
  if gap == '0' and offset > stored_end then gap = '1' end
end
redis.call('XADD', KEYS[1], '*', 'l', ARGV[2], 'o', ARGV[3], 'g', gap, 'd', ARGV[6])
local bytes = redis.call('HINCRBY', KEYS[2], bkey, #ARGV[6])
redis.call('HSET', KEYS[2], lkey, ARGV[2], ekey, offset + length)
local cap, entries = tonumber(ARGV[7]), tonumber(ARGV[8])
for _ = 1, 64 do
  if bytes <= cap and redis.call('XLEN', KEYS[1]) <= entries then break end
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #oldest == 0 then
    redis.call('HSET', KEYS[2], bkey, 0)
    break
  end
  local size, fields = 0, oldest[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'd' then size = #fields[i + 1] end
  end
  redis.call('XDEL', KEYS[1], oldest[1][1])
  bytes = redis.call('HINCRBY', KEYS[2], bkey, -size)
end
redis.call('EXPIRE', KEYS[1], ARGV[9])
redis.call('EXPIRE', KEYS[2], ARGV[9])
return 1
"""


def job_log_stream(job_id: int, node: str) -> str:
    return f"colony:job:{job_id}:log:{node}"


def job_log_index(job_id: int) -> str:
    return f"colony:job:{job_id}:log"


def consume_logs(client: redis.Redis | None = None, max_batches: int = 20) -> int:
    """Fan in the nodes' logs streams and store what is waiting; returns how many entries were handled."""
    client = client or get_redis()
    for _ in range(FAN_IN_ROUNDS):
        if not fan_in(client, "logs").copied:
            break
    return drain(client, protocol.LOGS_STREAM, GROUP, _handle_entries, batch=BATCH, max_batches=max_batches,
                 claim_idle_ms=CLAIM_IDLE_MS)


def _handle_entries(client: redis.Redis, entries) -> int:
    """Parse and authenticate each entry, check its node holds the job (one query a batch), then
    store the chunks and ack everything in one pipeline. An outage leaves the batch unacked."""
    auth_required = agent_auth_required()
    parsed = []  # (entry id, fields, JobOutput)
    for entry_id, fields in entries:
        if fields is None:  # trimmed away while pending
            client.xack(protocol.LOGS_STREAM, GROUP, entry_id)
            continue
        message = parse_or_dead_letter(client, protocol.LOGS_STREAM, entry_id, fields, protocol.decode_output,
                                       auth_required)
        if message is None:
            client.xack(protocol.LOGS_STREAM, GROUP, entry_id)
            continue
        parsed.append((entry_id, fields, message))
    if not parsed:
        return len(entries)
    holding = placements.placed({(m.node, m.job_id) for _id, _fields, m in parsed})
    store = client.register_script(_STORE)
    pipe = client.pipeline(transaction=False)
    for entry_id, fields, message in parsed:
        if holding is not None and (message.node, message.job_id) not in holding:
            dead_letter(client, protocol.LOGS_STREAM, entry_id, fields,
                        f"node {message.node} does not hold job {message.job_id}: its output is refused")
            continue
        store(keys=[job_log_stream(message.job_id, message.node), job_log_index(message.job_id)],
              args=[message.node, message.launch_id or "", message.offset, message.length,
                    "1" if message.gap else "0", message.data, LOG_BYTES_CAP, LOG_MAX_ENTRIES, LOG_TTL_S],
              client=pipe)
    pipe.xack(protocol.LOGS_STREAM, GROUP, *[entry_id for entry_id, _fields, _m in parsed])
    pipe.execute()
    return len(entries)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class LogChunk:
    id: str  # the entry id: pass it as ``after`` to get what follows
    node: str
    launch_id: str | None
    offset: int
    gap: bool
    data: str


def log_nodes(client: redis.Redis, job_id: int) -> list[str]:
    """The nodes that sent output of the job (still kept), by name."""
    fields = client.hkeys(job_log_index(job_id))
    names = {_text(field)[:-len(":launch")] for field in fields if _text(field).endswith(":launch")}
    return sorted(name for name in names if protocol.NODE_NAME_RE.match(name))


def read_chunks(client: redis.Redis, job_id: int, nodes: list[str], after: str | None = None,
                limit: int = READ_LIMIT) -> list[LogChunk]:
    """Chunks of ``nodes`` newer than entry id ``after`` (all kept ones when None), oldest first,
    at most ``limit``. Ids of one node's stream are exact cursors; across nodes they order by the
    time Redis stored each chunk."""
    start = f"({after}" if after else "-"
    pipe = client.pipeline(transaction=False)
    for node in nodes:
        pipe.xrange(job_log_stream(job_id, node), min=start, max="+", count=limit)
    chunks = []
    for node, entries in zip(nodes, pipe.execute()):
        for entry_id, fields in entries:
            chunks.append(LogChunk(
                id=_text(entry_id), node=node, launch_id=_text(fields.get(b"l", b"")) or None,
                offset=int(fields.get(b"o", b"0")), gap=fields.get(b"g") == b"1",
                data=_text(fields.get(b"d", b"")),
            ))
    chunks.sort(key=lambda chunk: _id_key(chunk.id))
    return chunks[:limit]


ENTRY_ID_RE = r"^\d{1,20}-\d{1,20}$"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
