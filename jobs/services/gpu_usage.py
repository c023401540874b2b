"""Who uses which GPUs: now (overview, tenant bars), over time (GPU-hours per tenant per day) and
per GPU (the jobs that held a GPU in a time window, for the heatmap's hover).

Everything here is a cluster-wide aggregate or keyed by job id; deciding which job details a user
may see is the caller's business, through ``Job.objects.visible_to(user)``.

GPU-hours are allocation time x share: an allocation held from ``created_at`` to ``released_at``
(or now) with ``gpu_milli`` thousandths of a GPU counts ``hours x gpu_milli / 1000``, split at UTC
midnight, and is booked under the job's ``run_class``. Jobs placed before classes were recorded
(blank ``run_class``) count as guaranteed.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone as dt_timezone

from django.db.models import Count, Q
from django.utils import timezone

from jobs.choices import RunClass, JobState
from jobs.models import Allocation, Job, Tenant
from monitoring.choices import NodeHealth
from monitoring.models import Gpu

WHOLE_GPU_MILLI = 1000
# How far back the median wait looks, and at most how many placements it reads.
WAIT_WINDOW = timedelta(hours=24)
WAIT_SAMPLE = 5000


# ---------------------------------------------------------------- right now


@dataclass(frozen=True)
class GpuCounts:
    total: int
    busy: int  # held by at least one job (shared ones included)
    shared: int  # held by more than one job at once
    idle: int  # on an UP node, held by nobody
    lost: int  # on a LOST node
    cordoned_idle: int  # idle, but on a cordoned node: not offered to new jobs
    mig_instances: int = 0  # the MIG instances of the GPUs counted above, each a device of its own
    mig_instances_busy: int = 0


def gpu_counts() -> GpuCounts:
    """GPUs by state now. A GPU split into MIG instances counts once (busy when a job holds one of
    its instances, shared when several jobs hold them); its instances are counted beside it."""
    holders = Counter(
        Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True)
    )
    boards: dict[tuple, list] = {}  # physical GPU -> [jobs on it, node state, cordoned]
    instances = instances_busy = 0
    for gpu_id, node_id, parent, node_state, cordoned in Gpu.objects.filter(present=True).values_list(
        "id", "node_id", "parent_index", "node__state", "node__cordoned"
    ):
        if parent is not None:  # a MIG instance
            instances += 1
            instances_busy += holders[gpu_id] > 0
        board = boards.setdefault(("gpu", gpu_id) if parent is None else ("mig", node_id, parent),
                                  [0, node_state, cordoned])
        board[0] += holders[gpu_id]
    total = busy = shared = idle = lost = cordoned_idle = 0
    for jobs, node_state, cordoned in boards.values():
        total += 1
        if node_state == NodeHealth.LOST:
            lost += 1
        elif jobs:
            busy += 1
            shared += jobs > 1
        else:
            idle += 1
            cordoned_idle += cordoned
    return GpuCounts(total, busy, shared, idle, lost, cordoned_idle, instances, instances_busy)


@dataclass
class TenantNow:
    tenant: Tenant
    guaranteed_gpus_used: float = 0.0
    opportunistic_gpus_used: float = 0.0
    running_jobs: int = 0
    pending_jobs: int = 0

    @property
    def gpus_used(self) -> float:
        return self.guaranteed_gpus_used + self.opportunistic_gpus_used


def tenants_now() -> list[TenantNow]:
    """Every tenant with the GPUs its jobs hold now (in GPUs, fractions summed) by class."""
    rows = {tenant.pk: TenantNow(tenant) for tenant in Tenant.objects.all()}
    held = (
        Allocation.objects.filter(released_at__isnull=True)
        .values_list("job__tenant_id", "job__run_class", "gpu_milli")
    )
    for tenant_id, run_class, milli in held:
        row = rows.get(tenant_id)
        if row is None:
            continue
        if run_class == RunClass.OPPORTUNISTIC:
            row.opportunistic_gpus_used += milli / WHOLE_GPU_MILLI
        else:
            row.guaranteed_gpus_used += milli / WHOLE_GPU_MILLI
    counts = Job.objects.values("tenant_id").annotate(
        pending=Count("id", filter=Q(state=JobState.PENDING)),
        running=Count("id", filter=Q(state__in=(JobState.PLACED, JobState.RUNNING, JobState.CANCELLING))),
    )
    for count in counts:
        row = rows.get(count["tenant_id"])
        if row is not None:
            row.pending_jobs, row.running_jobs = count["pending"], count["running"]
    return list(rows.values())


@dataclass(frozen=True)
class QueueStats:
    pending: int
    running: int
    median_wait_s: float | None  # submit -> placement, over jobs placed in the last 24 h
    oldest_pending_s: float | None


def queue_stats(now: datetime | None = None) -> QueueStats:
    now = now or timezone.now()
    pending = Job.objects.filter(state=JobState.PENDING)
    oldest = pending.order_by("submitted_at").values_list("submitted_at", flat=True).first()
    waits = [
        (placed - submitted).total_seconds()
        for submitted, placed in Job.objects.filter(placed_at__gte=now - WAIT_WINDOW)
        .order_by("-placed_at").values_list("submitted_at", "placed_at")[:WAIT_SAMPLE]
    ]
    return QueueStats(
        pending=pending.count(),
        running=Job.objects.filter(state__in=(JobState.PLACED, JobState.RUNNING, JobState.CANCELLING)).count(),
        median_wait_s=statistics.median(waits) if waits else None,
        oldest_pending_s=(now - oldest).total_seconds() if oldest else None,
    )


def queue_positions(job_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Pending job id -> (position, length) in its tenant's queue, the order the scheduler takes a
    tenant's jobs in: priority (high first), then submit time. Non-pending ids are left out."""
    tenants = set(
        Job.objects.filter(pk__in=job_ids, state=JobState.PENDING).values_list("tenant_id", flat=True)
    )
    if not tenants:
        return {}
    queue: dict[int, list] = defaultdict(list)
    for pk, tenant_id, priority, submitted in Job.objects.filter(
        state=JobState.PENDING, tenant_id__in=tenants
    ).values_list("pk", "tenant_id", "priority", "submitted_at"):
        queue[tenant_id].append((-priority, submitted, pk))
    wanted, positions = set(job_ids), {}
    for entries in queue.values():
        entries.sort()
        for position, (_, _, pk) in enumerate(entries, start=1):
            if pk in wanted:
                positions[pk] = (position, len(entries))
    return positions


# ---------------------------------------------------------------- GPU-hours per tenant per day


@dataclass
class DayUsage:
    day: date
    tenant: str
    guaranteed_gpu_hours: float = 0.0
    opportunistic_gpu_hours: float = 0.0

    @property
    def total_gpu_hours(self) -> float:
        return self.guaranteed_gpu_hours + self.opportunistic_gpu_hours


def gpu_hours_by_day(days: int, now: datetime | None = None, tenant_slugs: list[str] | None = None) -> list[DayUsage]:
    """GPU-hours per tenant per UTC day for the last ``days`` days (today included), every
    (day, tenant) pair present, oldest day first."""
    now = now or timezone.now()
    first_day = now.astimezone(dt_timezone.utc).date() - timedelta(days=days - 1)
    start = datetime.combine(first_day, time.min, tzinfo=dt_timezone.utc)
    tenants = Tenant.objects.order_by("slug")
    if tenant_slugs is not None:
        tenants = tenants.filter(slug__in=tenant_slugs)
    slugs = list(tenants.values_list("slug", flat=True))
    table = {
        (first_day + timedelta(days=n), slug): DayUsage(first_day + timedelta(days=n), slug)
        for n in range(days) for slug in slugs
    }
    allocations = Allocation.objects.filter(
        Q(released_at__isnull=True) | Q(released_at__gt=start), created_at__lt=now, job__tenant__slug__in=slugs,
    ).values_list("job__tenant__slug", "job__run_class", "gpu_milli", "created_at", "released_at")
    for slug, run_class, milli, held_from, held_to in allocations.iterator(chunk_size=2000):
        share = milli / WHOLE_GPU_MILLI
        for day, seconds in _split_by_day(max(held_from, start), min(held_to or now, now)):
            row = table.get((day, slug))
            if row is None:
                continue
            if run_class == RunClass.OPPORTUNISTIC:
                row.opportunistic_gpu_hours += seconds / 3600 * share
            else:
                row.guaranteed_gpu_hours += seconds / 3600 * share
    return sorted(table.values(), key=lambda row: (row.day, row.tenant))


def _split_by_day(begin: datetime, end: datetime):
    """(UTC day, seconds) pieces of [begin, end)."""
    begin, end = begin.astimezone(dt_timezone.utc), end.astimezone(dt_timezone.utc)
    while begin < end:
        midnight = datetime.combine(begin.date() + timedelta(days=1), time.min, tzinfo=dt_timezone.utc)
        piece_end = min(end, midnight)
        yield begin.date(), (piece_end - begin).total_seconds()
        begin = piece_end


# ---------------------------------------------------------------- which jobs held a GPU when


@dataclass(frozen=True)
class Occupant:
    gpu_id: int
    job_id: int
    job_name: str
    tenant: str
    gpu_milli: int
    start: datetime
    end: datetime | None  # None: still held


def occupants(start: datetime, end: datetime, gpu_ids: list[int] | None = None) -> list[Occupant]:
    """Allocations that overlap [start, end), oldest first."""
    allocations = Allocation.objects.filter(
        Q(released_at__isnull=True) | Q(released_at__gt=start), created_at__lt=end
    )
    if gpu_ids is not None:
        allocations = allocations.filter(gpu_id__in=gpu_ids)
    return [
        Occupant(gpu_id, job_id, name, tenant, milli, created, released)
        for gpu_id, job_id, name, tenant, milli, created, released in allocations.order_by("created_at").values_list(
            "gpu_id", "job_id", "job__name", "job__tenant__slug", "gpu_milli", "created_at", "released_at"
        )
    ]


def live_holders(gpu_ids: list[int]) -> dict[int, list[Allocation]]:
    """GPU id -> the allocations holding it now, oldest first (for node pages)."""
    held: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in (
        Allocation.objects.filter(gpu_id__in=gpu_ids, released_at__isnull=True)
        .select_related("job__tenant", "job__owner").order_by("created_at")
    ):
        held[allocation.gpu_id].append(allocation)
    return held
