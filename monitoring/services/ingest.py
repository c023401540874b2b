"""Metric ingest: the metrics stream -> latest values in Redis and 10 s rollups in the database.

Run as many readers as you like (``manage.py ingest``); they share the stream through one consumer
group and entries left pending by a reader that died are claimed after ``CLAIM_IDLE_MS``. A batch
is acknowledged only after what it writes is committed, so a crash re-delivers instead of losing.
Writes are per batch (a few multi-row statements), never per sample. A sample that is not signed
by the node it names (when agent authentication is required) is dead-lettered like any garbage.

With ``hold_s`` > 0 (``manage.py ingest`` uses :data:`DEFAULT_HOLD_S`) a reader keeps the 10 s
buckets still filling in memory and writes each once, when it is over
(:class:`~monitoring.services.rollups.OpenBuckets`): a batch then commits only its job usage and
the buckets already over (late samples), and is acknowledged. Live values, job usage (peaks) and
alerts still follow every batch. The price: a reader that is killed (SIGKILL, power) loses the
held rows, at most ``hold_s`` seconds of samples; a reader that is stopped writes them first.

Two failures are told apart (:mod:`monitoring.services.poison`): a database *outage* keeps the
batch, unacked, and applies it once the database is back; a batch the database refuses for its
*data* is split to find the sample at fault, which is tried a bounded number of times and then
dead-lettered, while the rest of the batch is applied. No sample makes the reader exit.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple

import msgspec
import redis
from django import db
from django.conf import settings
from django.db import InterfaceError, OperationalError

from agents import protocol
from agents.protocol import (
    CLOCK_MHZ_MAX, COUNTER_MAX, ID_MAX, MAX_GPUS, MAX_MESSAGE_BYTES, NODE_NAME_RE, POWER_W_MAX,
    TEMPERATURE_C_MAX, TEMPERATURE_C_MIN, UNIX_TIME_MAX, XID_MAX,
)
from monitoring.models import Gpu
from monitoring.services import alerts, live, placements
from monitoring.services.fanin import fan_in
from monitoring.services.poison import PoisonCounter, apply_isolating, parse_or_dead_letter, reason_of
from monitoring.services.redis_client import numbers
from monitoring.services.registry import agent_auth_required
from monitoring.services.rollups import LIVE_RESOLUTION, Accumulator, OpenBuckets, flush
from agents.streams import claim_stale, consumer_name, ensure_group, read_new

log = logging.getLogger(__name__)

GROUP = "ingest"
STATS_KEY = "colony:ingest:stats"
# Newest sample time ingested per node: an agent re-sending its outage buffer after a reconnect
# may repeat samples, which must not be counted twice.
LAST_TS_KEY = "colony:ingest:last_ts"
CLAIM_IDLE_MS = 60_000
DB_BACKOFF_FIRST_S = 1.0
DB_BACKOFF_MAX_S = 30.0
# Longest wait for new samples between two fan-ins of the nodes' streams.
FAN_IN_BLOCK_MS = 200
# What a database that went away raises. Anything else applying a batch raises is blamed on its data.
DB_UNAVAILABLE = (OperationalError, InterfaceError)
# Longest a reader started by ``manage.py ingest`` holds an open bucket in memory (see module doc):
# above the 12 s a bucket normally stays open, so it only bounds buckets dated ahead of this clock.
DEFAULT_HOLD_S = 15.0
# Tries to write the held buckets when a reader stops while the database is away.
STOP_WRITE_TRIES = 5


# ---------------------------------------------------------------- the hot path's decoder
# pydantic's validate_json of a NodeSample costs ~250 us (most of a reader's CPU); msgspec decodes
# and bounds-checks the same message in C in a few. The structs below mirror protocol.NodeSample
# but are *stricter* (no lax coercions: "5" or 5.0 for an int, a non-canonical GPU index key):
# whatever they do not accept goes to protocol.decode_sample, which accepts or rejects it and
# names the reason. So a sample is refused exactly when the schema refuses it, and the fast path
# only ever accepts what the schema accepts (tests/monitoring/test_ingest_decoder.py checks both
# on generated samples). Keep these in step with agents/protocol.py.
_Mib, _Percent, _Index, _JobId = live.Mib, live.Percent, live.GpuIndex, live.JobId
_Clock = Annotated[int, msgspec.Meta(ge=0, le=CLOCK_MHZ_MAX)]
_STRUCT = {"forbid_unknown_fields": True, "frozen": True, "gc": False}


class FastGpuSample(msgspec.Struct, **_STRUCT):
    index: _Index
    util_sm: _Percent | None = None
    util_mem: _Percent | None = None
    mem_used_mib: _Mib | None = None
    mem_total_mib: _Mib | None = None
    temperature_c: Annotated[float, msgspec.Meta(ge=TEMPERATURE_C_MIN, le=TEMPERATURE_C_MAX)] | None = None
    power_w: Annotated[float, msgspec.Meta(ge=0, le=POWER_W_MAX)] | None = None
    sm_clock_mhz: _Clock | None = None
    mem_clock_mhz: _Clock | None = None
    ecc_uncorrected: Annotated[int, msgspec.Meta(ge=0, le=COUNTER_MAX)] | None = None
    xid_events: Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=XID_MAX)]], msgspec.Meta(max_length=64)] = []


class FastJobGpuSample(msgspec.Struct, **_STRUCT):
    job_id: _JobId
    gpu_index: _Index
    mem_used_mib: _Mib
    util_sm: _Percent | None = None


class FastNodeSample(msgspec.Struct, **_STRUCT):
    v: Literal[1]  # no default: a message off the wire must say its version
    node: str
    ts: Annotated[float, msgspec.Meta(ge=0, le=UNIX_TIME_MAX)]
    seq: Annotated[int, msgspec.Meta(ge=0, le=ID_MAX)]
    gpus: Annotated[list[FastGpuSample], msgspec.Meta(max_length=MAX_GPUS)]
    kind: Literal["node_sample"] = "node_sample"
    jobs: Annotated[list[FastJobGpuSample], msgspec.Meta(max_length=4096)] = []
    # JSON keys are strings; only canonical decimal ones are taken here (pydantic's lax str->int
    # takes more: those go to the schema).
    unattributed_mib: Annotated[dict[str, _Mib], msgspec.Meta(max_length=MAX_GPUS)] = {}
    running_jobs: Annotated[list[_JobId], msgspec.Meta(max_length=4096)] = []
    running_launches: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=4096)] = []
    duty_cycles: Annotated[list[Annotated[float, msgspec.Meta(ge=0, le=1)]], msgspec.Meta(max_length=4096)] = []


_fast_decoder = msgspec.json.Decoder(FastNodeSample)
_SAMPLE_FIELDS = frozenset({"m", b"m", protocol.SIGNATURE_FIELD, protocol.SIGNATURE_FIELD.encode()})
_GPU_KEYS = {str(index): index for index in range(MAX_GPUS)}


def decode_sample(fields: dict) -> protocol.NodeSample | FastNodeSample:
    """:func:`agents.protocol.decode_sample`, fast: the same samples accepted (as a
    :class:`FastNodeSample`, which reads like a NodeSample), the same refused with the same reason."""
    raw = fields.get("m", fields.get(b"m"))
    if raw is None or len(raw) > MAX_MESSAGE_BYTES or not fields.keys() <= _SAMPLE_FIELDS:
        return protocol.decode_sample(fields)
    try:
        sample = _fast_decoder.decode(raw)
    except msgspec.MsgspecError:
        return protocol.decode_sample(fields)
    if not NODE_NAME_RE.match(sample.node):
        return protocol.decode_sample(fields)
    if sample.unattributed_mib:
        if not sample.unattributed_mib.keys() <= _GPU_KEYS.keys():
            return protocol.decode_sample(fields)
        sample = msgspec.structs.replace(
            sample, unattributed_mib={_GPU_KEYS[key]: mib for key, mib in sample.unattributed_mib.items()})
    return sample


@dataclass
class BatchResult:
    entries: int = 0
    samples: int = 0
    dead: int = 0
    unknown_node: int = 0
    duplicates: int = 0
    # Per-job readings dropped: from a node the job is not (or not lately) placed on, or for a GPU
    # index the node does not have. Readings above the GPU's registered memory are clamped to it.
    foreign_usage: int = 0
    # Seconds from sample time to its batch being applied and acknowledged.
    lags: list[float] = field(default_factory=list)
    # (seconds from a bucket's end to its rows' commit, GPU samples in them) per bucket written.
    rollup_delays: list[tuple[float, int]] = field(default_factory=list)

    def add(self, other: "BatchResult") -> None:
        self.samples += other.samples
        self.dead += other.dead
        self.unknown_node += other.unknown_node
        self.duplicates += other.duplicates
        self.foreign_usage += other.foreign_usage
        self.lags += other.lags
        self.rollup_delays += other.rollup_delays


class Parsed(NamedTuple):
    """One stream entry that parsed (and authenticated) into a sample."""

    entry_id: bytes | str
    fields: dict
    sample: protocol.NodeSample
    raw: bytes | str


class GpuIds:
    """(node, index) -> Gpu id and registered memory, reloaded when a node it has not seen shows up."""

    def __init__(self):
        self._ids: dict[tuple[str, int], int] = {}
        self._memory: dict[tuple[str, int], int] = {}
        self._known_nodes: set[str] = set()

    def reload(self) -> None:
        rows = Gpu.objects.filter(present=True).values_list("node__name", "index", "id", "memory_mib")
        self._ids = {(node, index): gpu_id for node, index, gpu_id, _ in rows}
        self._memory = {(node, index): memory for node, index, _, memory in rows}
        self._known_nodes = {node for node, _ in self._ids}

    def knows(self, node: str) -> bool:
        if node not in self._known_nodes:
            self.reload()
        return node in self._known_nodes

    def get(self, node: str, index: int) -> int | None:
        return self._ids.get((node, index))

    def memory_mib(self, node: str, index: int) -> int | None:
        """The registered memory of that GPU; None when the node has no such GPU."""
        return self._memory.get((node, index))


class Ingestor:
    def __init__(self, client: redis.Redis, consumer: str | None = None, batch_size: int = 2000,
                 hold_s: float = 0.0, clock=time.time):
        self.client = client
        self.open = OpenBuckets(hold_s)
        self.clock = clock  # what tells a held bucket it is over
        self.consumer = consumer or consumer_name()
        self.batch_size = batch_size
        self.gpu_ids = GpuIds()
        self.poison = PoisonCounter(client, protocol.METRICS_STREAM, GROUP)
        # Samples of a batch whose commit failed (the database went away): applied again before
        # anything new. Entries that did not parse were dead-lettered and acked already.
        self._unapplied: list[Parsed] = []
        ensure_group(client, protocol.METRICS_STREAM, GROUP)
        agent_auth_required()  # warns now, at start, when it is off

    def run_once(self, block_ms: int | None = None) -> BatchResult:
        """Write the held buckets that are over; claim stale entries, then read one batch of new
        ones; apply, commit, ack. A batch that could not be committed is kept (still unacked) and
        applied first next time."""
        # Before reading: if the database is away this raises with nothing taken off the stream.
        delays = self._write_held(self.open.due(self.clock()))
        result = self._read_and_apply(block_ms)
        result.rollup_delays[:0] = delays
        return result

    def flush_open(self) -> list[tuple[float, int]]:
        """Write every held bucket now (a reader stopping); returns their rollup delays."""
        return self._write_held(self.open.due(self.clock(), everything=True))

    def _write_held(self, part: Accumulator) -> list[tuple[float, int]]:
        """Commit held rows (of acknowledged samples). Outages propagate with the rows still held.
        Rows the database refuses for their data are found by halving and dropped with an error
        logged: their samples were acknowledged, there is nothing left to dead-letter."""
        if not part:
            return []

        def piece_of(rows: list) -> Accumulator:
            piece = Accumulator()
            for table, key, bucket in rows:
                (piece.gpus if table == "gpu" else piece.jobs)[key] = bucket
            return piece

        def write(rows: list) -> None:
            piece = piece_of(rows)
            flush(piece)
            self.open.written(piece)  # at once: an outage in a later half must not write this twice

        def refused(row, exc: BaseException) -> bool:
            log.error("rollup row %s %s refused, %d samples dropped: %s", *row[:2], row[2].samples, reason_of(exc))
            self.open.written(piece_of([row]))
            self.client.hincrby(STATS_KEY, "rollup_rows_dropped", 1)
            return False

        try:
            flush(part)
            self.open.written(part)
        except DB_UNAVAILABLE:
            raise
        except Exception as exc:
            log.warning("held rollups refused (%s); writing them in halves", reason_of(exc))
            rows = [("gpu", key, b) for key, b in part.gpus.items()] + [("job", key, b) for key, b in part.jobs.items()]
            apply_isolating(rows, write, refused)
        return _delays(part, self.clock())

    def _read_and_apply(self, block_ms: int | None) -> BatchResult:
        if self._unapplied:
            parsed, self._unapplied = self._unapplied, []
            result = BatchResult(entries=len(parsed))
            self._apply_or_keep(parsed, result)
            return result
        try:
            moved = fan_in(self.client, "metrics")
            if block_ms is not None and moved.nodes:
                # Nodes write their own streams: a long block here would only delay the next fan-in.
                block_ms = min(block_ms, FAN_IN_BLOCK_MS) if not moved.copied else None
            entries = claim_stale(self.client, protocol.METRICS_STREAM, GROUP, self.consumer, CLAIM_IDLE_MS)
            entries += read_new(self.client, protocol.METRICS_STREAM, GROUP, self.consumer,
                                max(1, self.batch_size - len(entries)), block_ms=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # Redis restarted empty (it keeps nothing on disk): the group goes with the stream.
            log.warning("metrics consumer group missing (Redis restarted?); recreating it")
            ensure_group(self.client, protocol.METRICS_STREAM, GROUP)
            return BatchResult()
        return self.apply(entries)

    def apply(self, entries: list) -> BatchResult:
        """Parse ``entries`` (dead-lettering what does not parse), then apply the samples."""
        result = BatchResult(entries=len(entries))
        if entries:
            self._apply_or_keep(self._parse(entries, result), result)
        return result

    def _parse(self, entries: list, result: BatchResult) -> list[Parsed]:
        parsed: list[Parsed] = []
        dead: list = []
        auth_required = agent_auth_required()
        for entry_id, fields in entries:
            if fields is None:  # trimmed while pending
                dead.append(entry_id)
                continue
            sample = parse_or_dead_letter(self.client, protocol.METRICS_STREAM, entry_id, fields,
                                          decode_sample, auth_required)
            if sample is None:
                dead.append(entry_id)
                result.dead += 1
                continue
            parsed.append(Parsed(entry_id, fields, sample, fields.get(b"m", fields.get("m"))))
        if dead:
            self.client.xack(protocol.METRICS_STREAM, GROUP, *dead)
        return parsed

    def _apply_or_keep(self, parsed: list[Parsed], result: BatchResult) -> None:
        """Apply ``parsed``; keep it for later if the database is down; isolate and dead-letter
        the samples at fault if the database refuses the batch for its data."""
        if not parsed:
            return
        settled = []  # parts applied or dead-lettered (acked) before an outage, if any

        def apply_part(part: list[Parsed]) -> None:
            result.add(self._apply_samples(part))
            settled.append(part)

        def poisoned(entry: Parsed, exc: BaseException) -> bool:
            again = self.poison.failed(entry.entry_id, entry.fields, exc)
            if not again:
                result.dead += 1
                settled.append([entry])
            return again

        try:
            apply_isolating(parsed, apply_part, poisoned)
        except DB_UNAVAILABLE:
            # Parts applied before the database went away are in (and acked), and so are samples
            # dead-lettered meanwhile: keep the rest.
            self._unapplied = self._still_pending(parsed) if settled else parsed
            raise

    def _still_pending(self, parsed: list[Parsed]) -> list[Parsed]:
        ids = sorted((_text(entry.entry_id) for entry in parsed), key=_id_order)
        pending = self.client.xpending_range(protocol.METRICS_STREAM, GROUP, min=ids[0], max=ids[-1],
                                             count=len(ids), consumername=self.consumer)
        still = {_text(row["message_id"]) for row in pending}
        return [entry for entry in parsed if _text(entry.entry_id) in still]

    def _apply_samples(self, parsed: list[Parsed]) -> BatchResult:
        """Commit the rollups of ``parsed`` in one transaction, then ack them. Raises (with nothing
        committed) when the database refuses them."""
        result = BatchResult()
        samples, raws, result.duplicates = self._drop_repeats([entry.sample for entry in parsed],
                                                              [entry.raw for entry in parsed])
        acc = Accumulator()
        rightful = placements.placed((sample.node, usage.job_id) for sample in samples for usage in sample.jobs)
        for sample in samples:
            if not self.gpu_ids.knows(sample.node):
                result.unknown_node += 1
                continue
            for gpu in sample.gpus:
                gpu_id = self.gpu_ids.get(sample.node, gpu.index)
                if gpu_id is not None:
                    acc.add_gpu(gpu_id, sample.ts, gpu.util_sm, gpu.mem_used_mib, gpu.temperature_c, gpu.power_w)
            for usage in sample.jobs:
                # A node's numbers are untrusted: a job's reading never exceeds the memory of the GPU it
                # names (its peak becomes the job's profile, which later jobs are placed from), and a
                # reading for a GPU the node does not have, or a job not placed there, is dropped.
                capacity = self.gpu_ids.memory_mib(sample.node, usage.gpu_index)
                if capacity is None or (rightful is not None and (sample.node, usage.job_id) not in rightful):
                    result.foreign_usage += 1
                    continue
                acc.add_job(usage.job_id, sample.ts, min(usage.mem_used_mib, capacity), usage.util_sm)
            result.samples += 1
        write, hold = self.open.split(acc, self.clock())
        if write:
            flush(write)
        written_at = self.clock()
        # Held only once the batch's own writes are in: a batch refused or kept for later holds nothing.
        self.open.hold(hold, written_at)
        result.rollup_delays = _delays(write, written_at)
        # The rollups are committed: whatever happens to the alerts, the batch must not be applied
        # again (it would count twice). Alerts come back with the next samples that show the condition.
        self._raise_alerts(samples)
        committed = time.time()
        result.lags = [committed - sample.ts for sample in samples]
        live.store_latest(self.client, list(zip(samples, raws)))
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(protocol.METRICS_STREAM, GROUP, *[entry.entry_id for entry in parsed])
        pipe.hincrby(STATS_KEY, "samples", result.samples)
        pipe.hincrby(STATS_KEY, "unknown_node", result.unknown_node)
        pipe.hincrby(STATS_KEY, "duplicates", result.duplicates)
        pipe.hincrby(STATS_KEY, "foreign_usage", result.foreign_usage)
        newest: dict[str, float] = {}
        for sample in samples:
            newest[sample.node] = max(sample.ts, newest.get(sample.node, 0.0))
        if newest:
            pipe.hset(LAST_TS_KEY, mapping=newest)
        if result.lags:
            pipe.hset(STATS_KEY, mapping={"lag_p50": statistics.median(result.lags), "lag_max": max(result.lags),
                                          "committed_at": committed})
        pipe.execute()
        return result

    def _raise_alerts(self, samples: list) -> None:
        try:
            alerts.from_samples(samples, self.gpu_ids.get, settings.COLONY_ALERT_TEMPERATURE_C)
            return
        except DB_UNAVAILABLE as exc:
            log.warning("alerts for this batch skipped, the database went away: %s", str(exc).strip())
            return
        except Exception as exc:
            log.warning("alerts for this batch failed (%s); raising them sample by sample", reason_of(exc))
        for sample in samples:
            try:
                alerts.from_samples([sample], self.gpu_ids.get, settings.COLONY_ALERT_TEMPERATURE_C)
            except Exception as exc:
                log.error("alerts of node %s's sample %d skipped: %s", sample.node, sample.seq, reason_of(exc))

    def _drop_repeats(self, samples: list, raws: list) -> tuple[list, list, int]:
        if not samples:
            return samples, raws, 0
        nodes = sorted({sample.node for sample in samples})
        seen = {node: float(ts) for node, ts in zip(nodes, self.client.hmget(LAST_TS_KEY, nodes)) if ts is not None}
        kept, kept_raws = [], []
        for sample, raw in zip(samples, raws):
            if sample.ts > seen.get(sample.node, float("-inf")):
                kept.append(sample)
                kept_raws.append(raw)
                seen[sample.node] = sample.ts
        return kept, kept_raws, len(samples) - len(kept)

    def run_forever(self, stop: threading.Event, block_ms: int = 1000) -> None:
        """Read until ``stop`` is set, then write the held buckets."""
        try:
            self._run_until(stop, block_ms)
        finally:
            self._write_held_at_stop()

    def _write_held_at_stop(self) -> None:
        for attempt in range(STOP_WRITE_TRIES):
            if not self.open:
                return
            try:
                self.flush_open()
                return
            except DB_UNAVAILABLE as exc:
                log.warning("held rollups not written at stop, the database is away (%s)", str(exc).strip())
                _drop_broken_connections()
                time.sleep(min(DB_BACKOFF_MAX_S, DB_BACKOFF_FIRST_S * 2 ** attempt))
        if self.open:
            log.error("stopping with the rollups of %d acknowledged GPU samples unwritten",
                      sum(b.samples for b in self.open.held.gpus.values()))

    def _run_until(self, stop: threading.Event, block_ms: int) -> None:
        pause = DB_BACKOFF_FIRST_S
        while not stop.is_set():
            try:
                self.run_once(block_ms=block_ms)
                pause = DB_BACKOFF_FIRST_S
            except redis.ConnectionError as exc:
                log.warning("Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
            except DB_UNAVAILABLE as exc:
                # The samples stay unacked in Redis (and in hand): nothing is lost while we wait.
                log.warning("database unavailable (%s); retrying in %.0fs", str(exc).strip(), pause)
                _drop_broken_connections()
                stop.wait(pause)
                pause = min(DB_BACKOFF_MAX_S, pause * 2)
            except Exception:
                # Not the data (a sample at fault is dead-lettered inside run_once): a bug or an
                # unexpected Redis answer. Log it and carry on; the entries stay pending meanwhile.
                log.exception("ingest batch failed; retrying in %.0fs", pause)
                stop.wait(pause)
                pause = min(DB_BACKOFF_MAX_S, pause * 2)


def _drop_broken_connections() -> None:
    """Close database connections that no longer answer, so the next query opens a fresh one."""
    for connection in db.connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _delays(part: Accumulator, committed: float) -> list[tuple[float, int]]:
    return [(committed - (bucket + LIVE_RESOLUTION), n) for bucket, n in part.samples_per_bucket().items()]


def _id_order(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    return int(millis), int(seq or 0)


def ingest_stats(client: redis.Redis) -> dict[str, float]:
    return numbers(client, STATS_KEY)
