"""Metric ingest: the metrics stream -> latest values in Redis and 10 s rollups in the database.

Run as many readers as you like (``manage.py ingest``); they share the stream through one consumer
group and entries left pending by a reader that died are claimed after ``CLAIM_IDLE_MS``. A batch
is acknowledged only after its rollups are committed, so a crash re-delivers instead of losing.
Writes are per batch (a few multi-row statements), never per sample. A sample that is not signed
by the node it names (when agent authentication is required) is dead-lettered like any garbage.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

import redis
from django import db
from django.conf import settings
from django.db import InterfaceError, OperationalError

from agents import protocol
from monitoring.models import Gpu
from monitoring.services import alerts, live, placements
from monitoring.services.dead_letters import dead_letter
from monitoring.services.registry import agent_auth_required, authenticate
from monitoring.services.rollups import Accumulator, flush
from monitoring.services.streams import claim_stale, consumer_name, ensure_group, read_new

log = logging.getLogger(__name__)

GROUP = "ingest"
STATS_KEY = "colony:ingest:stats"
# Newest sample time ingested per node: an agent re-sending its outage buffer after a reconnect
# may repeat samples, which must not be counted twice.
LAST_TS_KEY = "colony:ingest:last_ts"
CLAIM_IDLE_MS = 60_000
DB_BACKOFF_FIRST_S = 1.0
DB_BACKOFF_MAX_S = 30.0
# What a database that went away raises (not what a bug raises: that should stop the reader).
DB_UNAVAILABLE = (OperationalError, InterfaceError)


@dataclass
class BatchResult:
    entries: int = 0
    samples: int = 0
    dead: int = 0
    unknown_node: int = 0
    duplicates: int = 0
    foreign_usage: int = 0  # per-job readings from a node the job was never placed on (dropped)
    lags: list[float] = field(default_factory=list)


class GpuIds:
    """(node, index) -> Gpu id, reloaded when a node it has not seen shows up."""

    def __init__(self):
        self._ids: dict[tuple[str, int], int] = {}
        self._known_nodes: set[str] = set()

    def reload(self) -> None:
        rows = Gpu.objects.filter(present=True).values_list("node__name", "index", "id")
        self._ids = {(node, index): gpu_id for node, index, gpu_id in rows}
        self._known_nodes = {node for node, _ in self._ids}

    def knows(self, node: str) -> bool:
        if node not in self._known_nodes:
            self.reload()
        return node in self._known_nodes

    def get(self, node: str, index: int) -> int | None:
        return self._ids.get((node, index))


class Ingestor:
    def __init__(self, client: redis.Redis, consumer: str | None = None, batch_size: int = 2000):
        self.client = client
        self.consumer = consumer or consumer_name()
        self.batch_size = batch_size
        self.gpu_ids = GpuIds()
        # A batch whose commit failed (the database went away): applied again before anything new.
        self._unapplied: list = []
        ensure_group(client, protocol.METRICS_STREAM, GROUP)
        agent_auth_required()  # warns now, at start, when it is off

    def run_once(self, block_ms: int | None = None) -> BatchResult:
        """Claim stale entries, then read one batch of new ones; apply, commit, ack. A batch that
        could not be committed is kept (still unacked) and applied first next time."""
        if self._unapplied:
            entries, self._unapplied = self._unapplied, []
            return self._apply_or_keep(entries)
        try:
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
        return self._apply_or_keep(entries)

    def _apply_or_keep(self, entries: list) -> BatchResult:
        try:
            return self.apply(entries)
        except DB_UNAVAILABLE:
            self._unapplied = entries
            raise

    def apply(self, entries: list) -> BatchResult:
        result = BatchResult(entries=len(entries))
        if not entries:
            return result
        samples: list[protocol.NodeSample] = []
        raws: list = []
        auth_required = agent_auth_required()
        for entry_id, fields in entries:
            if fields is None:  # trimmed while pending
                continue
            try:
                sample = protocol.decode_sample(fields)
                authenticate(fields, sample, auth_required)
                samples.append(sample)
                raws.append(fields.get(b"m", fields.get("m")))
            except protocol.ProtocolError as exc:
                dead_letter(self.client, protocol.METRICS_STREAM, entry_id, fields, str(exc))
                result.dead += 1
        samples, raws, result.duplicates = self._drop_repeats(samples, raws)
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
                if rightful is None or (sample.node, usage.job_id) in rightful:
                    acc.add_job(usage.job_id, sample.ts, usage.mem_used_mib, usage.util_sm)
                else:
                    result.foreign_usage += 1
            result.samples += 1
        if acc:
            flush(acc)
        try:
            alerts.from_samples(samples, self.gpu_ids.get, settings.COLONY_ALERT_TEMPERATURE_C)
        except DB_UNAVAILABLE as exc:
            # The rollups are committed: applying the batch again would count it twice. Alerts
            # come back with the next samples that still show the condition.
            log.warning("alerts for this batch skipped, the database went away: %s", str(exc).strip())
        committed = time.time()
        result.lags = [committed - sample.ts for sample in samples]
        live.store_latest(self.client, list(zip(samples, raws)))
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(protocol.METRICS_STREAM, GROUP, *[entry_id for entry_id, _ in entries])
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


def _drop_broken_connections() -> None:
    """Close database connections that no longer answer, so the next query opens a fresh one."""
    for connection in db.connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()


def ingest_stats(client: redis.Redis) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in client.hgetall(STATS_KEY).items()}
