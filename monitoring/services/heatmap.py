"""Time-series queries for the dashboard: GPU x time matrices from the rollups (the cluster
heatmap and the node pages) and one job's memory/utilisation series.

Each range has a column width chosen so that the matrix stays a few hundred columns wide
(1 h -> 10 s, 6 h -> 1 min, 24 h -> 5 min, 7 d -> 30 min: 360, 360, 288 and 336 columns). On
PostgreSQL the database computes every cell (a column one rollup bucket wide is one row, a wider
one a GROUP BY) and returns one array of (column, value) per GPU; elsewhere (SQLite) the cells
are read one by one and computed here, which is also the reference the fast path is tested against.

Ranges whose columns are a minute or wider read the 1 min rollups up to the last compacted minute
and the 10 s rollups after it, so the newest minutes show up before compaction has run.

Rows are GPUs (present ones), ordered by rack, node and index; ``groups`` marks each node's rows.
A MIG instance is a row of its own (jobs run on it), with its profile and the GPU it is carved
from; ``totals`` counts that GPU once and its instances apart (:mod:`monitoring.services.gpu_totals`).
Values: ``util`` is the mean SM utilisation in percent; ``mem`` is the peak memory used, in percent
of that GPU's memory (so 32 GB and 80 GB GPUs share one colour scale).

Nothing here knows about jobs: which job held a GPU when is added by ``jobs``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone
from functools import cached_property

from django.core.cache import cache
from django.db import connection
from django.db.models import Func, IntegerField, Max, Sum
from django.utils import timezone

from monitoring.choices import Resolution
from monitoring.models import Gpu, GpuRollup, JobRollup
from monitoring.services.gpu_totals import GpuTotals, totals_of


@dataclass(frozen=True)
class Span:
    seconds: int
    column_s: int


RANGES: dict[str, Span] = {
    "1h": Span(3600, 10),
    "6h": Span(6 * 3600, 60),
    "24h": Span(24 * 3600, 300),
    "7d": Span(7 * 24 * 3600, 1800),
}
METRICS = ("util", "mem")


@dataclass(frozen=True)
class Row:
    gpu_id: int
    node: str
    rack: str
    index: int
    model: str
    memory_mib: int
    mig_profile: str | None = None  # a MIG instance: its profile and the index of its GPU
    parent_index: int | None = None


@dataclass
class Group:
    node: str
    rack: str
    state: str
    cordoned: bool
    first_row: int
    rows: int


@dataclass
class Heatmap:
    range_key: str
    metric: str
    column_s: int
    start: datetime
    end: datetime
    rows: list[Row] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    values: list[list[float | None]] = field(default_factory=list)
    totals: GpuTotals = field(default_factory=GpuTotals)

    @property
    def columns(self) -> int:
        return int((self.end - self.start).total_seconds()) // self.column_s


class ColumnIndex(Func):
    """(epoch(expression) - origin) // width, as an integer, on SQLite and PostgreSQL."""

    output_field = IntegerField()

    def __init__(self, expression, origin: int, width: int):
        super().__init__(expression)
        self.origin, self.width = origin, width

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"((CAST(strftime('%%s', {sql}) AS INTEGER) - %s) / %s)", [*params, self.origin, self.width]

    def as_postgresql(self, compiler, connection, **extra):
        # Integer epoch arithmetic: numeric EXTRACT and FLOOR cost more than the scan itself. The
        # range filter keeps every bucket at or after the origin, so the division never rounds a
        # negative number the wrong way.
        sql, params = compiler.compile(self.source_expressions[0])
        return (f"((EXTRACT(EPOCH FROM {sql}))::bigint - %s) / %s", [*params, self.origin, self.width])

    def as_sql(self, compiler, connection, **extra):  # pragma: no cover - other databases
        raise NotImplementedError(f"heatmap columns are not implemented for {connection.vendor}")


def gpu_heatmap(range_key: str, metric: str, now: datetime | None = None,
                nodes: list[str] | None = None) -> Heatmap:
    if range_key not in RANGES:
        raise ValueError(f"unknown range {range_key!r}; one of {', '.join(RANGES)}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    span = RANGES[range_key]
    now = now or timezone.now()
    start_epoch, end_epoch = _window(span, now)
    heatmap = Heatmap(range_key, metric, span.column_s, _dt(start_epoch), _dt(end_epoch))
    gpus = _gpus(nodes)
    heatmap.rows = _rows(gpus)
    heatmap.totals = totals_of(gpus)
    for position, gpu in enumerate(gpus):
        node = gpu.node
        if not heatmap.groups or heatmap.groups[-1].node != node.name:
            heatmap.groups.append(Group(node.name, node.rack, node.state, node.cordoned, position, 0))
        heatmap.groups[-1].rows += 1
    if not gpus:
        return heatmap
    heatmap.values = _cached_matrix(Cells.of(metric, heatmap.rows, span), start_epoch, end_epoch,
                                    int(now.timestamp()))
    return heatmap


def _window(span: Span, now: datetime) -> tuple[int, int]:
    """[start, end) in epoch seconds: the span, up to the end of the current column."""
    end_epoch = (int(now.timestamp()) // span.column_s + 1) * span.column_s
    return end_epoch - span.seconds, end_epoch


def _gpus(nodes: list[str] | None) -> list[Gpu]:
    """The matrix's GPUs in row order (present ones; of ``nodes`` only, if given)."""
    gpus = _ordered(Gpu.objects.filter(present=True).select_related("node"))
    if nodes is not None:
        gpus = gpus.filter(node__name__in=nodes)
    return list(gpus)


def _ordered(gpus):
    """GPUs in matrix row order: by rack, node and index."""
    return gpus.order_by("node__rack", "node__name", "index")


def _rows(gpus: list[Gpu]) -> list[Row]:
    return [Row(gpu.id, gpu.node.name, gpu.node.rack, gpu.index, gpu.model, gpu.memory_mib, gpu.mig_profile,
                gpu.parent_index) for gpu in gpus]


# Columns that ended this long ago no longer change: the samples an agent buffers while Redis is
# away (up to 5 min) and the buckets the ingest holds open (15 s) have arrived. Their cells are
# cached in blocks of BLOCK_COLUMNS columns aligned on the epoch, so consecutive requests (and
# users) share them and only the newest block or two are read from the rollups each time.
SETTLED_S = 600
BLOCK_COLUMNS = 60


@dataclass(frozen=True)
class Cells:
    """What a block of the matrix is computed from: the metric, the GPU rows (in matrix order),
    the span (column width) and each GPU's row number."""

    metric: str
    rows: list[Row]
    span: Span
    row_of: dict[int, int]

    @classmethod
    def of(cls, metric: str, rows: list[Row], span: Span) -> Cells:
        return cls(metric, rows, span, {row.gpu_id: n for n, row in enumerate(rows)})

    @property
    def block_s(self) -> int:
        return BLOCK_COLUMNS * self.span.column_s

    @cached_property
    def gpus_digest(self) -> str:
        return _gpus_digest(self.row_of)

    def key(self, block_start: int) -> str:
        return _block_key(self.metric, self.span, self.gpus_digest, block_start)


def _gpus_digest(gpu_ids) -> str:
    """Names the GPU rows (ids in matrix order) a cached block was computed for."""
    return hashlib.sha1(",".join(map(str, gpu_ids)).encode()).hexdigest()[:16]


def _block_key(metric: str, span: Span, gpus_digest: str, block_start: int) -> str:
    return f"colony:heatmap:{metric}:{span.column_s}:{gpus_digest}:{block_start}"


def _cached_matrix(cells: Cells, start_epoch: int, end_epoch: int, now_epoch: int) -> list[list[float | None]]:
    """The matrix of columns [start, end): settled blocks from the cache (computing and caching the
    missing ones in one read), the unsettled rest from the rollups."""
    block_s = cells.block_s
    blocks = _settled_blocks(cells, start_epoch, end_epoch, now_epoch)
    found = cache.get_many([cells.key(b) for b in blocks]) if blocks else {}
    missing = [b for b in blocks if cells.key(b) not in found]
    if missing:
        found.update(_fill_blocks(cells, missing))
    pieces = [(block, found[cells.key(block)]) for block in blocks]
    tail_start = max(start_epoch, blocks[-1] + block_s) if blocks else start_epoch
    if tail_start < end_epoch:
        pieces.append((tail_start, _matrix(cells, tail_start, end_epoch)))
    values: list[list[float | None]] = [[] for _ in cells.row_of]
    for since, matrix in pieces:
        skip = max(0, (start_epoch - since) // cells.span.column_s)
        keep = (end_epoch - since) // cells.span.column_s
        for row, part in zip(values, matrix):
            row.extend(part[skip:keep])
    return values


def _settled_blocks(cells: Cells, start_epoch: int, end_epoch: int, now_epoch: int) -> list[int]:
    """Starts of the blocks that overlap [start, end) and have settled by ``now``."""
    block_s = cells.block_s
    settled_until = (now_epoch - SETTLED_S) // block_s * block_s
    return list(range(start_epoch // block_s * block_s, min(settled_until, end_epoch), block_s))


def _fill_blocks(cells: Cells, blocks: list[int]) -> dict[str, list[list[float | None]]]:
    """Compute these blocks (ascending) in one read of the rollups, cache them and return them by key.
    A block is kept as long as a view of its span can show it."""
    block_s = cells.block_s
    computed = _matrix(cells, blocks[0], blocks[-1] + block_s)
    filled = {}
    for block in blocks:
        offset = (block - blocks[0]) // cells.span.column_s
        filled[cells.key(block)] = [row[offset: offset + BLOCK_COLUMNS] for row in computed]
    cache.set_many(filled, timeout=cells.span.seconds + block_s)
    return filled


# Kept warm in the background (``warm_settled_blocks``): the ranges whose blocks are an hour or
# less of rollups, so that one block costs a task run what a viewer's request would have cost for
# it. The 24 h and 7 d ranges read 5 h and 30 h blocks; those stay on demand.
WARMED_RANGES = ("1h", "6h")
# Per range and metric and run, newest first: after the GPU set changes, a 6 h view is whole
# again within three runs, and no run holds a worker for the whole span's read at once.
WARM_BLOCKS_PER_RUN = 2


def warm_settled_blocks(now: datetime | None = None) -> int:
    """Compute and cache the whole cluster's settled heatmap blocks that no view has cached yet, for
    the ``WARMED_RANGES``: the first view after a quiet spell, a restart of the web process or a
    GPU arriving then reads only its unsettled columns. Each block is computed once when it settles
    (or once after the GPU set changes), what the first viewer would otherwise have waited for.
    Returns how many blocks were computed."""
    now = now or timezone.now()
    # The GPUs' ids name the cached blocks; their rows are built only when a block is missing (a
    # few times an hour): 8,192 GPUs built every minute to find every block cached cost most of a run.
    gpu_ids = list(_ordered(Gpu.objects.filter(present=True)).values_list("id", flat=True))
    if not gpu_ids:
        return 0
    digest, rows = _gpus_digest(gpu_ids), None
    computed = 0
    for range_key in WARMED_RANGES:
        span = RANGES[range_key]
        start_epoch, end_epoch = _window(span, now)
        for metric in METRICS:
            blocks = _settled_blocks(Cells(metric, [], span, {}), start_epoch, end_epoch, int(now.timestamp()))
            missing = [b for b in reversed(blocks)
                       if not cache.has_key(_block_key(metric, span, digest, b))][:WARM_BLOCKS_PER_RUN]
            if missing:
                rows = rows or _rows(_gpus(None))
                _fill_blocks(Cells.of(metric, rows, span), sorted(missing))
                computed += len(missing)
    return computed


def _matrix(cells: Cells, since_epoch: int, until_epoch: int) -> list[list[float | None]]:
    """Columns [since, until) (both column boundaries), computed from the rollups."""
    fill = _values_in_postgresql if connection.vendor == "postgresql" else _values_in_python
    return fill(cells, since_epoch, until_epoch)


def _values_in_python(cells: Cells, since_epoch: int, until_epoch: int):
    """The matrix from rollup cells read one by one (SQLite, and the reference the PostgreSQL path
    is tested against)."""
    row_of = cells.row_of
    columns = (until_epoch - since_epoch) // cells.span.column_s
    if cells.metric == "util":
        util_sum = [[0.0] * columns for _ in row_of]
        util_n = [[0] * columns for _ in row_of]
        for gpu_id, column, u_sum, u_n in _cells(cells, since_epoch, until_epoch, ("util_sum", "util_n")):
            row = row_of[gpu_id]
            util_sum[row][column] += u_sum or 0.0
            util_n[row][column] += u_n or 0
        return [[round1(s / n) if n else None for s, n in zip(sums, counts)]
                for sums, counts in zip(util_sum, util_n)]
    mem_max: list[list[float | None]] = [[None] * columns for _ in row_of]
    for gpu_id, column, m_max in _cells(cells, since_epoch, until_epoch, ("mem_max",)):
        row = row_of[gpu_id]
        if m_max is not None and (mem_max[row][column] is None or m_max > mem_max[row][column]):
            mem_max[row][column] = m_max
    return [[round1(100.0 * m / row.memory_mib) if m is not None and row.memory_mib else None for m in maxima]
            for row, maxima in zip(cells.rows, mem_max)]


def round1(value: float) -> float:
    """One decimal, ties to even on ``value * 10``: what PostgreSQL's ``round(float8)`` does on
    the same double (the fast path rounds there), so both paths give the same matrix."""
    return round(value * 10) / 10


# One cell's value from one rollup row, or from a group of rows (a column wider than a bucket).
# float8 arithmetic throughout: a numeric round per cell cost more than the scan.
_CELL_SQL = {
    ("util", False): "CASE WHEN r.util_n > 0 THEN round(r.util_sum / r.util_n * 10) / 10 END",
    ("util", True): "round(SUM(r.util_sum) / NULLIF(SUM(r.util_n), 0) * 10) / 10",
    ("mem", False): "round(100 * r.mem_max::float8 / NULLIF(g.memory_mib, 0) * 10) / 10",
    ("mem", True): "round(100 * MAX(r.mem_max)::float8 / NULLIF(MAX(g.memory_mib), 0) * 10) / 10",
}


def _values_in_postgresql(cells: Cells, since_epoch: int, until_epoch: int):
    """The matrix computed by PostgreSQL: each cell's value there, one array of (column, value)
    per GPU back. Python only drops the arrays into rows: a 6 h x 512 GPU matrix is ~184k cells,
    and reading them one tuple at a time (then averaging and rounding each) cost more than the scan."""
    span, row_of = cells.span, cells.row_of
    columns = (until_epoch - since_epoch) // span.column_s
    selects, params = [], []
    for source, since, until in _sources(span, _dt(since_epoch), _dt(until_epoch)):
        grouped = source != span.column_s
        column = "((EXTRACT(EPOCH FROM r.bucket_start))::bigint - %s) / %s"
        selects.append(
            f"SELECT r.gpu_id, {column} AS col, {_CELL_SQL[cells.metric, grouped]} AS v "
            "FROM monitoring_gpurollup r JOIN monitoring_gpu g ON g.id = r.gpu_id "
            # The GPU list filters the few GPU rows, not each rollup row: `r.gpu_id = ANY(list)`
            # walked a 512-item array for each of 184k rows (0.9 s of a 1.4 s query).
            "WHERE g.id = ANY(%s) AND r.resolution = %s AND r.bucket_start >= %s AND r.bucket_start < %s"
            + (" GROUP BY r.gpu_id, col" if grouped else ""))
        params += [since_epoch, span.column_s, list(row_of), int(source), since, until]
    sql = (f"SELECT gpu_id, array_agg(col), array_agg(v) FROM ({' UNION ALL '.join(selects)}) cells "
           "WHERE v IS NOT NULL GROUP BY gpu_id")
    values: list[list[float | None]] = [[None] * columns for _ in row_of]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for gpu_id, cols, cells in cursor.fetchall():
            row = values[row_of[gpu_id]]
            for col, value in zip(cols, cells):
                if 0 <= col < columns:
                    row[col] = value
    return values


_AGGREGATE = {"util_sum": Sum("util_sum"), "util_n": Sum("util_n"), "mem_max": Max("mem_max")}


def _cells(cells: Cells, since_epoch: int, until_epoch: int, fields: tuple[str, ...]):
    """(gpu_id, column, *fields) of every rollup cell in the range, from each source resolution.

    Where a column is exactly one rollup bucket wide (10 s columns from 10 s rollups, 1 min
    columns from 1 min rollups: the 1 h and 6 h ranges) each row is its own cell, so there is
    nothing to group: the database just streams the rows (a GROUP BY of ~184k rows into ~184k
    groups spilled to disk). Only the metric's own columns are read, and the column index is
    integer arithmetic on the epoch.
    """
    span = cells.span
    columns = (until_epoch - since_epoch) // span.column_s
    for source, since, until in _sources(span, _dt(since_epoch), _dt(until_epoch)):
        rows = GpuRollup.objects.filter(gpu_id__in=cells.row_of, resolution=source, bucket_start__gte=since,
                                        bucket_start__lt=until)
        column = ColumnIndex("bucket_start", since_epoch, span.column_s)
        if source == span.column_s:
            query = rows.annotate(column=column).values_list("gpu_id", "column", *fields)
        else:
            query = (rows.values("gpu_id", column=column)
                     .annotate(**{f"agg_{name}": _AGGREGATE[name] for name in fields})
                     .values_list("gpu_id", "column", *(f"agg_{name}" for name in fields)))
        for cell in _raw_rows(query.order_by()):
            if 0 <= cell[1] < columns:
                yield cell


def _raw_rows(queryset):
    """The queryset's rows as the driver returns them, skipping Django's per-value converters.

    A 6 h x 512 GPU matrix is ~184k grouped rows; the converters alone took ~1 s of a 1.3 s
    request. These columns are plain numbers, so there is nothing to convert.
    """
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(10_000):
            yield from rows


def _sources(span: Span, start: datetime, end: datetime):
    """(resolution, since, until) pieces that cover [start, end) without overlap."""
    if span.column_s < Resolution.ONE_MINUTE:
        return [(Resolution.TEN_SECONDS, start, end)]
    last_minute = (
        GpuRollup.objects.filter(resolution=Resolution.ONE_MINUTE, bucket_start__gte=start, bucket_start__lt=end)
        .aggregate(last=Max("bucket_start"))["last"]
    )
    if last_minute is None:
        return [(Resolution.TEN_SECONDS, start, end)]
    split = last_minute + timedelta(seconds=Resolution.ONE_MINUTE)
    # Back to a column boundary, so that no column takes cells from both resolutions: each column
    # is then one row or one group of one source, and nothing has to merge them. The 10 s rollups
    # of the minutes before the split are still there (kept a day; a column is at most 30 min).
    split = _dt(int(split.timestamp()) // span.column_s * span.column_s)
    if split <= start:
        return [(Resolution.TEN_SECONDS, start, end)]
    return [(Resolution.ONE_MINUTE, start, split), (Resolution.TEN_SECONDS, split, end)]


def _dt(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=dt_timezone.utc)


# ---------------------------------------------------------------- one job over time

# A job's series uses 10 s buckets while it is short, 1 min buckets (plus the newest 10 s ones
# not compacted yet) once the 10 s series would pass this many points.
JOB_SERIES_MAX_FINE_POINTS = 720


@dataclass(frozen=True)
class SeriesPoint:
    t: datetime
    mem_max_mib: int | None
    util: float | None


def job_series(job_id: int, start: datetime, end: datetime) -> tuple[int, list[SeriesPoint]]:
    """(seconds per point, points) of one job's GPU memory (max over its GPUs) and utilisation
    (mean over its GPUs) between ``start`` and ``end``."""
    start = _dt(int(start.timestamp()) // Resolution.TEN_SECONDS * Resolution.TEN_SECONDS)
    seconds = max(0.0, (end - start).total_seconds())
    if seconds / Resolution.TEN_SECONDS <= JOB_SERIES_MAX_FINE_POINTS:
        pieces, step = [(Resolution.TEN_SECONDS, start, end)], Resolution.TEN_SECONDS
    else:
        last_minute = (
            JobRollup.objects.filter(job_id=job_id, resolution=Resolution.ONE_MINUTE, bucket_start__gte=start)
            .aggregate(last=Max("bucket_start"))["last"]
        )
        split = last_minute + timedelta(seconds=Resolution.ONE_MINUTE) if last_minute else start
        pieces, step = [(Resolution.ONE_MINUTE, start, split), (Resolution.TEN_SECONDS, split, end)], 60
    points = []
    for resolution, since, until in pieces:
        rows = JobRollup.objects.filter(
            job_id=job_id, resolution=resolution, bucket_start__gte=since, bucket_start__lt=until
        ).order_by("bucket_start").values_list("bucket_start", "mem_max", "util_sum", "util_n")
        points += [
            SeriesPoint(bucket, mem, round(util_sum / util_n, 1) if util_n else None)
            for bucket, mem, util_sum, util_n in rows
        ]
    return step, points
