"""The latest sample of every node, kept in Redis for live views.

One hash, one field per node, holding the node's last NodeSample as the agent sent it: storing
the validated JSON as is costs one HSET per batch and no re-encoding. Readers derive per-GPU
and per-job views from it; entries carry their sample time and readers treat old ones as gone.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Annotated

import msgspec
import redis

from agents.protocol import ID_MAX, MAX_GPUS, MEMORY_MIB_MAX, UNIX_TIME_MAX, NodeSample
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

NODE_HASH = "colony:live:node"
STALE_AFTER_S = 30.0
# Node name -> what its last sample says it runs (its jobs, their launches, their duty cycles), and
# a token that changes whenever one of those does: node health finds that no node's jobs moved
# without reading a thousand samples (:func:`listings_token`).
LISTING_HASH = "colony:live:listing"
LISTING_TOKEN = "colony:live:listing-token"

# Listings are written only where they differ from the stored ones, and the token set anew
# (ARGV[1], a random value: never one a reader saw, even after Redis restarts empty) when any
# did, atomically: a reader that sees the old token sees no new listing.
#
# _STORE: the samples (ARGV[4..]: ARGV[3] node/sample pairs), then the listings that differ from
# what the writer last knew to be stored (node/listing pairs after them), compared and written
# only while the token is the one the writer knew (ARGV[2]): its knowledge is then exact, and a
# steady batch costs one HSET. Else {0, token}: the writer compares all its listings ('*').
_STORE = """
local first, last = 4, 3 + 2 * tonumber(ARGV[3])
while first <= last do  -- (in pieces: unpack has a limit of some thousands of values)
    local upto = math.min(first + 1999, last)
    redis.call('HSET', KEYS[1], unpack(ARGV, first, upto))
    first = upto + 1
end
local current = redis.call('GET', KEYS[3]) or ''
if ARGV[2] ~= '*' and current ~= ARGV[2] then
    return {0, current}
end
local changed = false
for i = last + 1, #ARGV, 2 do
    if redis.call('HGET', KEYS[2], ARGV[i]) ~= ARGV[i + 1] then
        redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
        changed = true
    end
end
if changed then
    redis.call('SET', KEYS[3], ARGV[1])
    return {1, ARGV[1]}
end
return {1, current}
"""
_FORGET = """
for i = 2, #ARGV do
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
end
redis.call('SET', KEYS[3], ARGV[1])
return #ARGV - 1
"""


def _script(client: redis.Redis, source: str):
    """``source`` as a script of ``client`` (run by its digest: the source is sent once)."""
    scripts = client.__dict__.setdefault("_colony_live_scripts", {})
    if source not in scripts:
        scripts[source] = client.register_script(source)
    return scripts[source]


def _token() -> str:
    return os.urandom(8).hex()


def listing_of(sample) -> bytes:
    """What node health reads of a sample's jobs, as stored beside it."""
    return msgspec.json.encode((sample.running_jobs, sample.running_launches, sample.duty_cycles))


def listings_token(client: redis.Redis) -> bytes | None:
    """The token of the nodes' listings now: the same token, the same listings (None: none yet)."""
    return client.get(LISTING_TOKEN)


# How far ahead of the control plane's clock a node's sample may be dated and still count.
FUTURE_SKEW_S = 30.0
# Per-job readings a sample may hold (as NodeSample.jobs).
MAX_JOB_READINGS = 4096


def store_latest(client: redis.Redis, samples: list[tuple[NodeSample, str]] | list[NodeSample]) -> None:
    """Keep the newest of ``samples`` per node; items are samples or (sample, raw JSON) pairs."""
    latest: dict[str, tuple[float, str, bytes]] = {}
    for item in samples:
        sample, raw = item if isinstance(item, tuple) else (item, None)
        if sample.node not in latest or latest[sample.node][0] <= sample.ts:
            # (the JSON as received only where the strict decoder took it: what the schema's lax
            # coercions accepted, "5" or 5.0 for an int, is stored as the schema reads it)
            kept = raw if raw is not None and not isinstance(sample, NodeSample) else sample.model_dump_json()
            latest[sample.node] = (sample.ts, kept, listing_of(sample))
    if latest:
        _store(client, latest)


class _Known:
    """What a writer knows to be stored of the listings, valid while the token is ``token``."""

    def __init__(self):
        self.token: bytes = b""
        self.listings: dict[str, bytes] = {}


def _store(client: redis.Redis, latest: dict[str, tuple[float, str, bytes]]) -> None:
    known = client.__dict__.setdefault("_colony_live_known", _Known())
    changed = [(node, listing) for node, (_, _, listing) in latest.items() if known.listings.get(node) != listing]
    ok, token = _script(client, _STORE)(keys=[NODE_HASH, LISTING_HASH, LISTING_TOKEN], args=[
        _token(), known.token, len(latest), *(part for node, (_, raw, _) in latest.items() for part in (node, raw)),
        *(part for pair in changed for part in pair)])
    if ok:
        known.listings.update(changed)
    else:  # (another writer moved the token: what this one knew may be stale)
        _, token = _script(client, _STORE)(keys=[NODE_HASH, LISTING_HASH, LISTING_TOKEN], args=[
            _token(), "*", 0, *(part for node, (_, _, listing) in latest.items() for part in (node, listing))])
        known.listings = {node: listing for node, (_, _, listing) in latest.items()}
    known.token = token if isinstance(token, bytes) else str(token).encode()


def _decoded(raw: bytes | str) -> dict | None:
    """A stored sample as a dict (decoded in C: the scheduling loop reads a thousand of them a
    cycle); None for anything else, which only a writer other than ``store_latest`` can leave."""
    try:
        sample = msgspec.json.decode(raw)
    except UNDECODABLE:
        return None
    if (not isinstance(sample, dict) or not isinstance(sample.get("ts"), (int, float)) or isinstance(sample["ts"], bool)
            or not isinstance(sample.get("gpus"), list) or not isinstance(sample.get("jobs", []), list)):
        return None
    return sample


def latest_nodes(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, dict]:
    """Node name -> its last sample as a dict, for nodes heard from within ``max_age`` seconds.
    An entry that is not a sample is passed over (and dropped by :func:`prune_stale`)."""
    return _fresh(client.hgetall(NODE_HASH).items(), _decoded, max_age)


def _fresh(entries, decode, max_age: float) -> dict:
    """Node name -> ``decode(its entry)``, of (name, entry) ``entries`` that decode (else None)
    and are fresh."""
    now, out = time.time(), {}
    for node, raw in entries:
        if raw is None:
            continue  # (no entry for that name)
        sample = decode(raw)
        if sample is None:
            log.warning("live sample of node %r is not a sample; ignored", node)
            continue
        ts = sample["ts"] if isinstance(sample, dict) else sample.ts
        # A sample dated ahead of this clock (a node whose clock jumped back since) is not fresh.
        if -FUTURE_SKEW_S <= now - ts <= max_age:
            out[node.decode(errors="replace") if isinstance(node, bytes) else node] = sample
    return out


# What decoding a stored entry may raise on something a writer other than store_latest left
# there (a hostile client on the same Redis): garbage, wrong types, nesting deep enough to
# exhaust the decoder's recursion. (msgspec.ValidationError is a DecodeError.)
UNDECODABLE = (msgspec.DecodeError, ValueError, TypeError, RecursionError)

# Numbers as the schema bounds them (agents/protocol.py); the ingest's fast decoder uses the same.
Mib = Annotated[int, msgspec.Meta(ge=0, le=MEMORY_MIB_MAX)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
GpuIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)]
JobId = Annotated[int, msgspec.Meta(gt=0, le=ID_MAX)]
UnixTime = Annotated[float, msgspec.Meta(ge=0, le=UNIX_TIME_MAX)]


class GpuUse(msgspec.Struct, frozen=True, gc=False):
    index: GpuIndex
    util_sm: Percent | None = None
    mem_used_mib: Mib | None = None


class JobUse(msgspec.Struct, frozen=True, gc=False):
    job_id: JobId
    util_sm: Percent | None = None  # on one of its GPUs


class NodeUse(msgspec.Struct, frozen=True):
    """What the scheduling loop reads of a node's last sample: when, and how busy its GPUs and
    jobs were. Decoded straight from the stored JSON, every other field skipped: the loop reads a
    thousand samples a cycle, and building a dict of every field was most of that. Bounded as
    the schema bounds a sample: a number no sample may hold passes the whole entry over."""

    ts: UnixTime
    gpus: Annotated[list[GpuUse], msgspec.Meta(max_length=MAX_GPUS)]
    jobs: Annotated[list[JobUse], msgspec.Meta(max_length=MAX_JOB_READINGS)] = []


_use_decoder = msgspec.json.Decoder(NodeUse)


def _use(raw: bytes | str) -> NodeUse | None:
    try:
        return _use_decoder.decode(raw)
    except UNDECODABLE:
        return None


def latest_use(client: redis.Redis, nodes: list[str], max_age: float = STALE_AFTER_S) -> dict[str, NodeUse]:
    """Node name -> what its last sample says of its GPUs' and jobs' use, for the ``nodes`` named
    (the inventory's: entries under other names cost the loop nothing) heard from within
    ``max_age`` seconds; what :func:`latest_nodes` reads, typed."""
    return _fresh(zip(nodes, client.hmget(NODE_HASH, nodes)) if nodes else (), _use, max_age)


def latest_gpus(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, dict]:
    """"node:index" -> that GPU's last reading (with the sample's ``ts``), as the agent sent it.
    Pages and the API read :func:`gpu_readings` (typed) instead; the metrics exporter and the
    thermal alerts still read this."""
    return {
        f"{node}:{gpu['index']}": {**gpu, "ts": sample["ts"]}
        for node, sample in latest_nodes(client, max_age).items()
        for gpu in sample["gpus"]
    }


def latest_jobs(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[int, dict]:
    """Job id -> {"ts", "node", "gpus": {index: {"mem_used_mib", "util_sm"}}}."""
    jobs: dict[int, dict] = {}
    for node, sample in latest_nodes(client, max_age).items():
        for usage in sample.get("jobs", []):
            entry = jobs.setdefault(usage["job_id"], {"ts": sample["ts"], "node": node, "gpus": {}})
            entry["gpus"][usage["gpu_index"]] = {"mem_used_mib": usage["mem_used_mib"], "util_sm": usage["util_sm"]}
    return jobs


def prune_stale(client: redis.Redis, older_than: float = 600.0) -> int:
    now = time.time()
    stale = [node for node, raw in client.hgetall(NODE_HASH).items()
             if (sample := _decoded(raw)) is None or now - sample["ts"] > older_than
             or sample["ts"] - now > FUTURE_SKEW_S]  # (dated ahead: not fresh now, nor in ten minutes)
    if not stale:
        return 0
    return _script(client, _FORGET)(keys=[NODE_HASH, LISTING_HASH, LISTING_TOKEN], args=[_token(), *stale])


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What the pages and the API show of a GPU's latest sample (None: the GPU could not tell)."""

    ts: float  # when its node took the sample (unix time)
    util_sm: float | None
    mem_used_mib: int | None
    mem_total_mib: int | None
    temperature_c: float | None
    power_w: float | None

    @classmethod
    def from_sample(cls, gpu: dict, ts: float) -> GpuReading:
        """From one GPU of a stored NodeSample (validated on ingest: absent readings are None)."""
        return cls(ts=ts, util_sm=gpu.get("util_sm"), mem_used_mib=gpu.get("mem_used_mib"),
                   mem_total_mib=gpu.get("mem_total_mib"), temperature_c=gpu.get("temperature_c"),
                   power_w=gpu.get("power_w"))


def gpu_readings(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, GpuReading]:
    """"node:index" -> that GPU's latest reading, for GPUs whose node was heard from lately."""
    return {
        f"{node}:{gpu['index']}": GpuReading.from_sample(gpu, sample["ts"])
        for node, sample in latest_nodes(client, max_age).items()
        for gpu in sample["gpus"]
    }


def live_gpus() -> dict[str, GpuReading]:
    """Latest reading per "node:index"; empty (the page shows no live values) if Redis is down."""
    try:
        return gpu_readings(get_redis())
    except (redis.RedisError, OSError) as exc:
        log.warning("live GPU values unavailable: %s", exc)
        return {}


def live_summary() -> dict:
    readings = list(live_gpus().values())
    utils = [r.util_sm for r in readings if r.util_sm is not None]
    return {
        "gpus_reporting": len(readings),
        "util_mean": round(sum(utils) / len(utils), 1) if utils else None,
        "mem_used_mib": sum(r.mem_used_mib or 0 for r in readings),
        "mem_total_mib": sum(r.mem_total_mib or 0 for r in readings),
    }
