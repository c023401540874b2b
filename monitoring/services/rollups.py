"""Fold samples into fixed time buckets and merge them into the rollup tables.

Buckets hold sums, counts and maxima, so partial buckets from several flushes (or several ingest
readers) merge with an additive upsert: nothing is read back, and the order of flushes does not
matter. The live path writes 10 s buckets; ``compact_minutes`` derives 1 min buckets from them.

:class:`OpenBuckets` lets a reader hold the buckets still filling in memory and write each once it
is over, instead of upserting every open bucket on every batch (up to ten times per row at 1 Hz).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone

from django.db import connection, transaction
from django.db.models import Max, Sum

from monitoring.choices import Resolution
from monitoring.models import GpuRollup, JobRollup

LIVE_RESOLUTION = Resolution.TEN_SECONDS
# A bucket is over this long after its end: samples a little late (reader lag, a node's clock a
# little behind) still land in it before it is written. A later one is merged in a second write.
CLOSE_GRACE_S = 2.0


def bucket_of(ts: float, resolution: int = LIVE_RESOLUTION) -> int:
    return int(ts // resolution * resolution)


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


@dataclass
class GpuBucket:
    samples: int = 0
    util_sum: float = 0.0
    util_n: int = 0
    util_max: float | None = None
    mem_sum: float = 0.0
    mem_n: int = 0
    mem_max: int | None = None
    temp_max: float | None = None
    power_sum: float = 0.0
    power_n: int = 0

    def add(self, util, mem, temp, power) -> None:
        self.samples += 1
        if util is not None:
            self.util_sum += util
            self.util_n += 1
            self.util_max = _max(self.util_max, util)
        if mem is not None:
            self.mem_sum += mem
            self.mem_n += 1
            self.mem_max = _max(self.mem_max, mem)
        self.temp_max = _max(self.temp_max, temp)
        if power is not None:
            self.power_sum += power
            self.power_n += 1

    def merge(self, other: "GpuBucket") -> None:
        self.samples += other.samples
        self.util_sum += other.util_sum
        self.util_n += other.util_n
        self.util_max = _max(self.util_max, other.util_max)
        self.mem_sum += other.mem_sum
        self.mem_n += other.mem_n
        self.mem_max = _max(self.mem_max, other.mem_max)
        self.temp_max = _max(self.temp_max, other.temp_max)
        self.power_sum += other.power_sum
        self.power_n += other.power_n


@dataclass
class JobBucket:
    samples: int = 0
    mem_max: int | None = None
    util_sum: float = 0.0
    util_n: int = 0

    def add(self, mem, util) -> None:
        self.samples += 1
        self.mem_max = _max(self.mem_max, mem)
        if util is not None:
            self.util_sum += util
            self.util_n += 1

    def merge(self, other: "JobBucket") -> None:
        self.samples += other.samples
        self.mem_max = _max(self.mem_max, other.mem_max)
        self.util_sum += other.util_sum
        self.util_n += other.util_n


@dataclass
class JobUsageDelta:
    peak_mib: int = 0
    util_sum: float = 0.0
    util_n: int = 0
    first_ts: float = float("inf")
    last_ts: float = 0.0


@dataclass
class Accumulator:
    """What a batch of samples adds; ``flush`` writes it in a handful of statements."""

    gpus: dict[tuple[int, int], GpuBucket] = field(default_factory=lambda: defaultdict(GpuBucket))
    jobs: dict[tuple[int, int], JobBucket] = field(default_factory=lambda: defaultdict(JobBucket))
    usage: dict[int, JobUsageDelta] = field(default_factory=lambda: defaultdict(JobUsageDelta))

    def __bool__(self) -> bool:
        return bool(self.gpus or self.jobs or self.usage)

    def samples_per_bucket(self) -> dict[int, int]:
        """GPU samples per bucket start."""
        counts: dict[int, int] = defaultdict(int)
        for (_, bucket), b in self.gpus.items():
            counts[bucket] += b.samples
        return counts

    def add_gpu(self, gpu_id: int, ts: float, util, mem, temp, power) -> None:
        self.gpus[(gpu_id, bucket_of(ts))].add(util, mem, temp, power)

    def add_job(self, job_id: int, ts: float, mem: int, util) -> None:
        self.jobs[(job_id, bucket_of(ts))].add(mem, util)
        usage = self.usage[job_id]
        usage.peak_mib = max(usage.peak_mib, mem)
        if util is not None:
            usage.util_sum += util
            usage.util_n += 1
        usage.first_ts = min(usage.first_ts, ts)
        usage.last_ts = max(usage.last_ts, ts)


def bucket_over(bucket: int, now: float) -> bool:
    return now >= bucket + LIVE_RESOLUTION + CLOSE_GRACE_S


class OpenBuckets:
    """GPU and job buckets of samples already applied (acknowledged) but not yet written.

    A bucket is written once: when it is over (its 10 s and :data:`CLOSE_GRACE_S` have passed on
    this clock), or when it has been held ``hold_s`` (a node whose clock runs ahead dates samples
    into buckets that end late), or when the reader stops. Held rows are what a reader that is
    killed loses: at most ``hold_s`` seconds of samples (normally the filling bucket and the
    grace of the one before, <= 12 s). ``hold_s`` 0 writes every bucket with its batch.
    Job usage (peaks: the scheduler and profiles read them) is never held.
    """

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.held = Accumulator()
        self.opened: dict[int, float] = {}  # bucket start -> when its first row was held

    def __bool__(self) -> bool:
        return bool(self.opened)

    def _due(self, bucket: int, now: float) -> bool:
        return self.hold_s <= 0 or bucket_over(bucket, now) or now - self.opened.get(bucket, now) >= self.hold_s

    def split(self, acc: Accumulator, now: float) -> tuple[Accumulator, Accumulator]:
        """(the part of ``acc`` to write now, with its job usage; the part to hold once that is written)."""
        write, hold = Accumulator(usage=acc.usage), Accumulator()
        for key, bucket in acc.gpus.items():
            (write if self._due(key[1], now) else hold).gpus[key] = bucket
        for key, bucket in acc.jobs.items():
            (write if self._due(key[1], now) else hold).jobs[key] = bucket
        return write, hold

    def hold(self, part: Accumulator, now: float) -> None:
        for target, rows in ((self.held.gpus, part.gpus), (self.held.jobs, part.jobs)):
            for key, bucket in rows.items():
                mine = target.get(key)
                if mine is None:
                    target[key] = bucket
                else:
                    mine.merge(bucket)
                self.opened.setdefault(key[1], now)

    def due(self, now: float, everything: bool = False) -> Accumulator:
        """The held rows to write now; they stay held until :meth:`written` says they are in."""
        buckets = {bucket for bucket in self.opened if everything or self._due(bucket, now)}
        out = Accumulator()
        if buckets:
            out.gpus.update((key, b) for key, b in self.held.gpus.items() if key[1] in buckets)
            out.jobs.update((key, b) for key, b in self.held.jobs.items() if key[1] in buckets)
        return out

    def written(self, part: Accumulator) -> None:
        for key in part.gpus:
            del self.held.gpus[key]
        for key in part.jobs:
            del self.held.jobs[key]
        left = {key[1] for key in self.held.gpus} | {key[1] for key in self.held.jobs}
        self.opened = {bucket: since for bucket, since in self.opened.items() if bucket in left}


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=dt_timezone.utc)


def _greatest(a: str, b: str) -> str:
    fn = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    # NULL-safe on both backends: SQLite's MAX(x, NULL) is NULL.
    return f"{fn}(COALESCE({a}, {b}), COALESCE({b}, {a}))"


def _least(a: str, b: str) -> str:
    fn = "LEAST" if connection.vendor == "postgresql" else "MIN"
    return f"{fn}(COALESCE({a}, {b}), COALESCE({b}, {a}))"


def _upsert(table: str, columns: dict[str, str], conflict: list[str], updates: dict[str, str],
            rows: list[tuple]) -> None:
    """One multi-row upsert. ``columns`` maps each column to its PostgreSQL type.

    On PostgreSQL the rows travel as one array literal per column through ``unnest``: one
    statement, and building ``{1,2,3}`` text is far cheaper than adapting thousands of Python
    values (executemany took ~2 s for 10k rows, this ~0.1 s). SQLite, in-process, takes
    executemany.
    """
    if not rows:
        return
    names = ", ".join(columns)
    tail = (
        f" ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET "
        + ", ".join(f"{column} = {expression}" for column, expression in updates.items())
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            aliases = [f"c{i}" for i in range(len(columns))]
            selected = ", ".join(
                f"to_timestamp({alias})" if pg_type == "timestamptz" else alias
                for alias, pg_type in zip(aliases, columns.values())
            )
            arrays = ", ".join(
                "%s::float8[]" if pg_type == "timestamptz" else f"%s::{pg_type}[]" for pg_type in columns.values()
            )
            cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT {selected} FROM unnest({arrays}) AS u({', '.join(aliases)})"
                + tail,
                [_array_literal(column) for column in zip(*rows)],
            )
        else:
            placeholders = ", ".join(["%s"] * len(columns))
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({placeholders})" + tail,
                               [tuple(_sqlite(v) for v in row) for row in rows])


def _array_literal(values: tuple) -> str:
    if isinstance(values[0], datetime):
        values = [value.timestamp() for value in values]
    # str() of an int, float or IntegerChoices is its number; "None" appears in no number.
    return "{" + ",".join(map(str, values)).replace("None", "NULL") + "}"


def _sqlite(value):
    return connection.ops.adapt_datetimefield_value(value) if isinstance(value, datetime) else value


def _add(table: str, column: str) -> str:
    return f"{table}.{column} + EXCLUDED.{column}"


def flush(acc: Accumulator) -> None:
    """Merge the accumulated buckets and job usage into the database in one transaction."""
    g, j, u = GpuRollup._meta.db_table, JobRollup._meta.db_table, "monitoring_jobusage"
    with transaction.atomic():
        _upsert(
            g,
            {"gpu_id": "bigint", "resolution": "smallint", "bucket_start": "timestamptz", "samples": "integer",
             "util_sum": "float8", "util_n": "integer", "util_max": "float8", "mem_sum": "float8",
             "mem_n": "integer", "mem_max": "integer", "temp_max": "float8", "power_sum": "float8",
             "power_n": "integer"},
            ["gpu_id", "resolution", "bucket_start"],
            {
                **{c: _add(g, c)
                   for c in ("samples", "util_sum", "util_n", "mem_sum", "mem_n", "power_sum", "power_n")},
                **{c: _greatest(f"{g}.{c}", f"EXCLUDED.{c}") for c in ("util_max", "mem_max", "temp_max")},
            },
            [
                (gpu_id, LIVE_RESOLUTION, _dt(bucket), b.samples, b.util_sum, b.util_n, b.util_max, b.mem_sum,
                 b.mem_n, b.mem_max, b.temp_max, b.power_sum, b.power_n)
                for (gpu_id, bucket), b in acc.gpus.items()
            ],
        )
        _upsert(
            j,
            {"job_id": "bigint", "resolution": "smallint", "bucket_start": "timestamptz", "samples": "integer",
             "mem_max": "integer", "util_sum": "float8", "util_n": "integer"},
            ["job_id", "resolution", "bucket_start"],
            {
                **{c: _add(j, c) for c in ("samples", "util_sum", "util_n")},
                "mem_max": _greatest(f"{j}.mem_max", "EXCLUDED.mem_max"),
            },
            [
                (job_id, LIVE_RESOLUTION, _dt(bucket), b.samples, b.mem_max, b.util_sum, b.util_n)
                for (job_id, bucket), b in acc.jobs.items()
            ],
        )
        _upsert(
            u,
            {"job_id": "bigint", "peak_gpu_memory_mib": "integer", "util_sum": "float8", "util_n": "integer",
             "first_seen_at": "timestamptz", "last_seen_at": "timestamptz"},
            ["job_id"],
            {
                "peak_gpu_memory_mib": _greatest(f"{u}.peak_gpu_memory_mib", "EXCLUDED.peak_gpu_memory_mib"),
                "util_sum": _add(u, "util_sum"),
                "util_n": _add(u, "util_n"),
                "first_seen_at": _least(f"{u}.first_seen_at", "EXCLUDED.first_seen_at"),
                "last_seen_at": _greatest(f"{u}.last_seen_at", "EXCLUDED.last_seen_at"),
            },
            [
                (job_id, d.peak_mib, d.util_sum, d.util_n, _dt(d.first_ts), _dt(d.last_ts))
                for job_id, d in acc.usage.items()
            ],
        )


def compact_minutes(since: datetime, until: datetime) -> int:
    """(Re)compute 1 min GPU and job buckets in [since, until) from the 10 s ones; idempotent."""
    written = 0
    minute = timedelta(seconds=Resolution.ONE_MINUTE)
    start = since.replace(second=0, microsecond=0)
    while start < until:
        end = start + minute
        written += _compact_model(GpuRollup, "gpu_id", start, end, {
            "samples": Sum("samples"), "util_sum": Sum("util_sum"), "util_n": Sum("util_n"),
            "util_max": Max("util_max"), "mem_sum": Sum("mem_sum"), "mem_n": Sum("mem_n"),
            "mem_max": Max("mem_max"), "temp_max": Max("temp_max"), "power_sum": Sum("power_sum"),
            "power_n": Sum("power_n"),
        })
        written += _compact_model(JobRollup, "job_id", start, end, {
            "samples": Sum("samples"), "mem_max": Max("mem_max"), "util_sum": Sum("util_sum"),
            "util_n": Sum("util_n"),
        })
        start = end
    return written


def _compact_model(model, key: str, start: datetime, end: datetime, aggregates: dict) -> int:
    rows = (
        model.objects.filter(resolution=LIVE_RESOLUTION, bucket_start__gte=start, bucket_start__lt=end)
        .values(key).annotate(**aggregates)
    )
    objects = [model(resolution=Resolution.ONE_MINUTE, bucket_start=start, **row) for row in rows]
    model.objects.bulk_create(
        objects, update_conflicts=True, unique_fields=[key.removesuffix("_id") if key == "gpu_id" else key,
                                                       "resolution", "bucket_start"],
        update_fields=list(aggregates), batch_size=1000,
    )
    return len(objects)
