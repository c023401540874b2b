"""Ingest throughput and lag: N simulated nodes x 8 GPUs at 1 Hz through the real pipeline.

    python bench/ingest.py --nodes 1024 --seconds 30

A producer process writes one NodeSample per node per second to the metrics stream (as agents
do); this process runs the real ``Ingestor`` (parse, live values in Redis, additive 10 s rollups
in the database, ack) and measures, for every sample, the lag from its timestamp to the commit
of its rollup. Prints sustained samples/s, p50/p99 lag, the backlog left at the end, and the
reader's capacity (how fast it drains a backlog). As a baseline in the same process it measures
how fast one reader can merely read, decode, verify and ack the same entries (signed as the
agents sign them) with the reader's own decoder and signature check (``parse_or_dead_letter``
with ``monitoring.services.ingest.decode_sample``), and no database: the ratio shows what the
database, live values and rollups cost. A row apart decodes with pydantic
(``agents.protocol.decode_sample``, the protocol's reference decoder, ~5x the reader's CPU): it
is no baseline of the reader, only what the fast decoder saves.

Wall time on a shared machine moves a lot between identical runs, so CPU is measured too: the
reader's own ``process_time``, and the CPU of its PostgreSQL backend and of Redis (from ``/proc``),
each per node sample; the capacity and the baseline compare CPU of every process involved
(reader + PostgreSQL + Redis).
Two lags are reported: *processed* (sample time -> its batch applied and acknowledged: live
values, job usage and alerts visible) and *rollup written* (how long after its 10 s bucket ended a
bucket's row was committed; the reader holds open buckets in memory and writes each once).
The bench uses a database of its own (``$COLONY_BENCH_DB``, else ``colony_bench_ingest_<pid>``,
dropped at exit) so it can run beside other benches. Nodes are registered in bulk: the first
through ``register_node``, the others as copies of its rows (one at a time, 2,048 took over 18
minutes on a loaded machine).

Samples are signed with each node's key and verified by the reader (``COLONY_AGENT_AUTH=required``,
as in production); ``--auth off`` sends them unsigned and unchecked, to show what verification costs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import backend_pid, proc_cpu, setup  # noqa: E402

GPUS_PER_NODE = 8
# Made before Django reads its settings (main), inherited by the forked producer.
SECRET = secrets.token_hex(32)


def sample_json(node: str, seq: int, ts: float) -> str:
    gpus = [{"index": i, "util_sm": (seq * 7 + i * 13) % 100, "util_mem": 30.0, "mem_used_mib": 20000 + i,
             "mem_total_mib": 81920, "temperature_c": 60.0, "power_w": 250.0, "sm_clock_mhz": 1410,
             "mem_clock_mhz": 1593, "ecc_uncorrected": 0, "xid_events": []} for i in range(GPUS_PER_NODE)]
    jobs = [{"job_id": 1 + hash(node) % 100000, "gpu_index": i, "mem_used_mib": 20000, "util_sm": 80.0}
            for i in range(GPUS_PER_NODE)]
    return json.dumps({"v": 1, "kind": "node_sample", "node": node, "ts": ts, "seq": seq, "gpus": gpus,
                       "jobs": jobs, "running_jobs": [jobs[0]["job_id"]]})


class Signer:
    """Stream fields of a sample as its node's agent writes them: signed, or plain with ``auth`` off."""

    def __init__(self, auth: bool):
        from agents import signing

        self._signing, self.auth, self._keys = signing, auth, {}

    def fields(self, node: str, seq: int, ts: float) -> dict[str, str]:
        payload = sample_json(node, seq, ts)
        if not self.auth:
            return {"m": payload}
        key = self._keys.get(node)
        if key is None:
            key = self._keys[node] = self._signing.node_key(SECRET, node)
        return {"m": payload, "sig": self._signing.sign(key, payload)}


def produce(redis_url: str, nodes: int, seconds: float, stream: str, auth: bool) -> None:
    import redis

    from agents.protocol import STREAM_MAXLEN as maxlen  # trimmed as the agents trim it

    signer = Signer(auth)
    client = redis.Redis.from_url(redis_url)
    start = time.time()
    seq = 0
    while time.time() - start < seconds:
        tick = time.time()
        pipe = client.pipeline(transaction=False)
        for n in range(nodes):
            pipe.xadd(stream, signer.fields(f"bench-{n:05d}", seq, time.time()), maxlen=maxlen, approximate=True)
        pipe.execute()
        seq += 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))


def register(nodes: int) -> None:
    """``nodes`` nodes registered as their agents would register them: the first through
    ``register_node`` (the production path), the others in bulk as copies of the rows it wrote
    (only the node's name and its GPUs' UUIDs differ), in one transaction that announces the
    inventory change once, as each ``register_node`` does. There is no bulk registration in
    production (agents register one by one, at start); here one at a time cost minutes."""
    from django.db import transaction

    from agents.protocol import GpuInfo, NodeRegistered
    from monitoring.models import Gpu, Node
    from monitoring.services.registry import inventory_changed, register_node

    template = register_node(NodeRegistered(
        node="bench-00000", backend="simulated", agent_version="bench", hostname="bench",
        gpus=[GpuInfo(index=i, uuid=f"GPU-bench-0-{i}", model="A100-80GB", memory_mib=81920)
              for i in range(GPUS_PER_NODE)],
    ))
    template_gpus = list(Gpu.objects.filter(node=template).order_by("index"))

    def copy(row, **changes):
        fields = {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields if not f.primary_key}
        return type(row)(**{**fields, **changes})

    with transaction.atomic():
        rows = Node.objects.bulk_create([copy(template, name=f"bench-{n:05d}") for n in range(1, nodes)],
                                        batch_size=1000)
        Gpu.objects.bulk_create([copy(gpu, node_id=row.pk, uuid=f"GPU-bench-{n}-{gpu.index}")
                                 for n, row in enumerate(rows, 1) for gpu in template_gpus], batch_size=2000)
        inventory_changed()  # (bulk_create sends no signal)
    assert Gpu.objects.filter(node__name__startswith="bench-", present=True).count() == nodes * GPUS_PER_NODE


class Cpu:
    """CPU seconds of the reader (this process), its PostgreSQL backend and Redis, between marks."""

    def __init__(self, redis_pid: int | None):
        self.pg_pid = backend_pid()
        self.redis_pid = redis_pid

    def now(self) -> dict[str, float]:
        return {"wall": time.perf_counter(), "reader": time.process_time(), "pg": proc_cpu(self.pg_pid),
                "redis": proc_cpu(self.redis_pid)}

    @staticmethod
    def since(mark: dict[str, float], end: dict[str, float]) -> dict[str, float]:
        return {key: end[key] - mark[key] for key in mark}


def parse_only_rate(client, stream: str, count: int, nodes: int, signer: Signer, cpu: Cpu, decode
                    ) -> tuple[float, dict[str, float]]:
    """Baseline: read, decode with ``decode``, check the signature (as the reader does, with
    ``parse_or_dead_letter``) and ack ``count`` pre-filled entries, signed as the pipeline's are,
    in batches of the reader's size, with no database. Returns (entries per wall second, CPU
    seconds spent by each process)."""
    from monitoring.services.ingest import Ingestor
    from monitoring.services.poison import parse_or_dead_letter
    from monitoring.services.registry import agent_auth_required

    batch = inspect.signature(Ingestor).parameters["batch_size"].default  # (the reader's, as the bench runs it)
    client.delete(stream)
    pipe = client.pipeline(transaction=False)
    base = time.time()
    for i in range(count):
        pipe.xadd(stream, signer.fields(f"bench-{i % nodes:05d}", i, base + i / nodes))
    pipe.execute()
    client.xgroup_create(stream, "baseline", id="0")
    auth_required = agent_auth_required()
    mark, done, dead = cpu.now(), 0, 0
    while done < count:
        entries = client.xreadgroup("baseline", "b", {stream: ">"}, count=batch)[0][1]
        samples = [parse_or_dead_letter(client, stream, entry_id, fields, decode, auth_required)
                   for entry_id, fields in entries]
        client.xack(stream, "baseline", *[entry_id for entry_id, _ in entries])
        done += len(samples)
        dead += samples.count(None)
    spent = Cpu.since(mark, cpu.now())
    client.delete(stream)
    if dead:
        raise SystemExit(f"the baseline dead-lettered {dead} of its entries: it would not measure parsing")
    return count / spent["wall"], spent


def per_sample_us(spent: dict[str, float], count: int) -> dict[str, float]:
    """CPU microseconds per entry of each process, and of all of them (``all``)."""
    us = {key: spent[key] / count * 1e6 for key in ("reader", "pg", "redis")}
    return {**us, "all": sum(us.values())}


def drain_rate(client, ingestor, stream: str, count: int, nodes: int, signer: Signer, cpu: Cpu
               ) -> tuple[float, dict[str, float]]:
    """Capacity: how fast the full pipeline drains a backlog of ``count`` entries (open buckets
    written at the end included). Returns (entries per wall second, CPU seconds spent)."""
    pipe = client.pipeline(transaction=False)
    base = time.time() + 3600  # newer than anything ingested, so none is dropped as a repeat
    for i in range(count):
        pipe.xadd(stream, signer.fields(f"bench-{i % nodes:05d}", 10_000 + i, base + i / nodes))
    pipe.execute()
    mark, done = cpu.now(), 0
    while done < count:
        done += ingestor.run_once().entries
    flush_open(ingestor)
    spent = Cpu.since(mark, cpu.now())
    return count / spent["wall"], spent


def flush_open(ingestor) -> list:
    """Write the buckets a reader holds open (a reader that writes through holds none)."""
    close = getattr(ingestor, "flush_open", None)
    return close() if close else []


def verify_cost_us(count: int = 10_000) -> float:
    """Microseconds the reader spends checking one signed sample (key cached, as in the reader)."""
    from agents import protocol
    from monitoring.services.registry import authenticate

    signer = Signer(True)
    entries = [signer.fields(f"bench-{i % 1000:05d}", i, time.time()) for i in range(count)]
    entries = [{k.encode(): v.encode() for k, v in fields.items()} for fields in entries]  # as Redis returns them
    messages = [protocol.decode_sample(fields) for fields in entries]
    started = time.perf_counter()
    for fields, message in zip(entries, messages):
        authenticate(fields, message, required=True)
    return (time.perf_counter() - started) / count * 1e6


class Resources:
    """Every ``every`` seconds: RSS of the reader and the producer, Redis memory, stream length,
    and samples ingested since the last reading (for a soak: does anything grow without bound?)."""

    def __init__(self, client, producer_pid: int, every: float = 10.0):
        import psutil

        self.client, self.every, self.rows = client, every, []
        self.me, self.producer = psutil.Process(), psutil.Process(producer_pid)
        self._next, self._samples = time.time() + every, 0

    def tick(self, samples_total: int) -> None:
        now = time.time()
        if now < self._next:
            return
        from agents import protocol

        try:
            producer_rss = self.producer.memory_info().rss
        except Exception:  # the producer has finished
            producer_rss = 0
        self.rows.append({"t": now, "reader_mib": self.me.memory_info().rss / 2**20,
                          "producer_mib": producer_rss / 2**20,
                          "redis_mib": self.client.info("memory")["used_memory"] / 2**20,
                          "stream_len": self.client.xlen(protocol.METRICS_STREAM),
                          "rate": (samples_total - self._samples) / (now - self._next + self.every)})
        self._next, self._samples = now + self.every, samples_total

    def report(self) -> None:
        if len(self.rows) < 2:
            return
        first, last = self.rows[0], self.rows[-1]
        rates = [r["rate"] for r in self.rows[1:]]
        print(f"  soak, every {self.every:.0f} s ({len(self.rows)} readings; first -> last, max):")
        for key, label in (("reader_mib", "reader RSS MiB"), ("producer_mib", "producer RSS MiB"),
                           ("redis_mib", "Redis used MiB"), ("stream_len", "metrics stream entries")):
            print(f"    {label:<23}: {first[key]:,.0f} -> {last[key]:,.0f}, max {max(r[key] for r in self.rows):,.0f}")
        print(f"    node samples/s per window: min {min(rates):,.0f}, median {statistics.median(rates):,.0f}, "
              f"max {max(rates):,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    parser.add_argument("--auth", choices=["required", "off"], default="required",
                        help="agent authentication: signed samples, verified (default), or neither")
    parser.add_argument("--hold-s", type=float, default=None,
                        help="longest an open 10 s bucket is held in memory (default: what manage.py ingest uses; "
                             "0 writes every bucket on every batch)")
    parser.add_argument("--backlog", type=int, default=10_000,
                        help="entries the capacity (drain) and the baselines each read")
    args = parser.parse_args()
    os.environ["COLONY_AGENT_AUTH"] = args.auth
    os.environ["COLONY_AGENT_SECRET"] = SECRET

    db_label, redis_server = setup(args.database, "colony_bench_ingest")
    import redis

    from agents import protocol
    from monitoring.services import ingest as ingest_module
    from monitoring.services.ingest import GROUP, Ingestor

    client = redis.Redis.from_url(redis_server.url)
    register(args.nodes)
    signer = Signer(args.auth == "required")
    cpu = Cpu(redis_server.process.pid if redis_server.process else None)
    baseline, baseline_spent = parse_only_rate(client, "bench:baseline", args.backlog, args.nodes, signer, cpu,
                                               ingest_module.decode_sample)
    pydantic, pydantic_spent = parse_only_rate(client, "bench:baseline", args.backlog, args.nodes, signer, cpu,
                                               protocol.decode_sample)
    base_us, pydantic_us = per_sample_us(baseline_spent, args.backlog), per_sample_us(pydantic_spent, args.backlog)

    producer = multiprocessing.Process(target=produce, args=(redis_server.url, args.nodes, args.warmup + args.seconds,
                                                             protocol.METRICS_STREAM, signer.auth))
    options = {}
    if "hold_s" in inspect.signature(Ingestor).parameters:
        options["hold_s"] = ingest_module.DEFAULT_HOLD_S if args.hold_s is None else args.hold_s
    ingestor = Ingestor(client, consumer="bench", **options)
    producer.start()
    resources = Resources(client, producer.pid)
    lags: list[float] = []
    written: list[tuple[float, int]] = []  # (seconds after its bucket ended, samples) per bucket row
    samples = 0
    batch_seconds: list[float] = []
    started = time.time()
    measuring_from = started + args.warmup
    mark = None
    while producer.is_alive() or client.xinfo_groups(protocol.METRICS_STREAM)[0]["lag"]:
        t0 = time.perf_counter()
        if mark is None and time.time() >= measuring_from:
            mark = cpu.now()
        result = ingestor.run_once(block_ms=200)
        if mark is not None and result.samples:
            lags.extend(result.lags)
            samples += result.samples
            batch_seconds.append(time.perf_counter() - t0)
        if mark is not None:
            written += getattr(result, "rollup_delays", [])
        resources.tick(samples)
        if time.time() - started > args.warmup + args.seconds + 60:
            break
    producer.join()
    written += flush_open(ingestor)
    spent = Cpu.since(mark, cpu.now())
    measured = time.time() - measuring_from
    capacity, drained = drain_rate(client, ingestor, protocol.METRICS_STREAM, args.backlog, args.nodes, signer, cpu)
    drained_us = per_sample_us(drained, args.backlog)
    backlog = client.xinfo_groups(protocol.METRICS_STREAM)[0]
    from agents.streams import dead_letter_count

    rejected = dead_letter_count(client)
    lags.sort()
    p = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")  # noqa: E731
    written.sort()
    rollup_total = sum(n for _, n in written)

    def rollup_p(q: float) -> float:
        seen = 0
        for delay, n in written:
            seen += n
            if seen >= q * rollup_total:
                return delay
        return float("nan")

    hold = options.get("hold_s", "n/a (writes every batch)")
    print(f"ingest bench: {args.nodes} nodes x {GPUS_PER_NODE} GPUs = {args.nodes * GPUS_PER_NODE} GPUs at 1 Hz, "
          f"{db_label}, 1 reader, {args.seconds:.0f} s measured after {args.warmup:.0f} s warm-up, "
          f"agent auth {args.auth}, hold_s {hold}")
    print(f"  node samples ingested/s : {samples / measured:,.0f}  (offered {args.nodes:,}/s) = "
          f"{samples / measured / args.nodes:.2f}x offered")
    print(f"  GPU samples ingested/s  : {samples * GPUS_PER_NODE / measured:,.0f}")
    print(f"  lag sample->processed   : p50 {p(0.5):.2f} s   p99 {p(0.99):.2f} s   max {lags[-1] if lags else 0:.2f} s"
          "  (acked; live values, job usage, alerts)")
    if written:
        print(f"  rollup written after its bucket ended: p50 {rollup_p(0.5):.2f} s   p99 {rollup_p(0.99):.2f} s   "
              f"max {written[-1][0]:.2f} s  (by samples; a sample waits up to 10 s more for its bucket to end)")
    else:
        print("  rollup written after its bucket ended: = lag sample->processed (every bucket written every batch)")
    per = max(samples, 1)
    print(f"  CPU while measured      : wall {spent['wall']:.1f} s; reader {spent['reader']:.2f} s "
          f"({spent['reader'] / spent['wall']:.2f} core), PostgreSQL backend {spent['pg']:.2f} s, "
          f"Redis {spent['redis']:.2f} s")
    print(f"  CPU per node sample     : reader {spent['reader'] / per * 1e6:.0f} us, "
          f"PostgreSQL {spent['pg'] / per * 1e6:.0f} us,"
          f" Redis {spent['redis'] / per * 1e6:.0f} us (with the producer's writes)  (reader / baseline reader = "
          f"{spent['reader'] / per * 1e6 / base_us['reader']:.2f}x)")
    print(f"  batch time              : median {statistics.median(batch_seconds) * 1000:.0f} ms over "
          f"{len(batch_seconds)} batches")
    print(f"  backlog at end          : {backlog['lag']} unread, {backlog['pending']} unacked ({GROUP})")
    print(f"  capacity (drain backlog): {capacity:,.0f} node samples/s = {capacity * GPUS_PER_NODE:,.0f} GPU "
          f"samples/s, {capacity / args.nodes:.1f}x the offered load; CPU per sample {drained_us['all']:.0f} us: "
          f"reader {drained_us['reader']:.0f} + PostgreSQL {drained_us['pg']:.0f} + Redis {drained_us['redis']:.0f} "
          f"(wall {drained['wall']:.1f} s for {args.backlog:,})")
    print(f"  baseline: read, decode, verify, ack; reader's decoder, no database: {baseline:,.0f} node samples/s, "
          f"CPU per sample {base_us['all']:.0f} us (reader {base_us['reader']:.0f} + Redis {base_us['redis']:.0f}); "
          f"capacity / baseline = {capacity / baseline:.2f}x by rate, "
          f"CPU per sample {drained_us['all'] / base_us['all']:.1f}x "
          f"(all processes), {drained_us['reader'] / base_us['reader']:.1f}x (reader)")
    print(f"  not a baseline: same with pydantic (agents.protocol.decode_sample, not the reader's decoder): "
          f"{pydantic:,.0f} node samples/s, CPU per sample {pydantic_us['all']:.0f} us (reader "
          f"{pydantic_us['reader']:.0f}); the reader's decoder takes {pydantic_us['reader'] / base_us['reader']:.1f}x "
          f"less reader CPU")
    resources.report()
    print(f"  signature check         : {verify_cost_us():.1f} us per sample (auth {args.auth}); "
          f"{rejected} sample(s) dead-lettered")
    if rejected:
        raise SystemExit("samples were dead-lettered: the figures above do not measure the pipeline")
    redis_server.stop()


if __name__ == "__main__":
    main()
