"""Tenants' decayed GPU usage: advanced once per cycle from what they hold now."""

from __future__ import annotations

from django.db import connection
from django.utils import timezone

from jobs.choices import RunClass
from jobs.models import Allocation, Job, Tenant
from jobs.scheduling.usage import decay_usage
from jobs.services.table_changes import KeptWhileUnchanged


def advance_usage(half_life_s: float) -> None:
    now = timezone.now()
    held_milli = _charged_milli_by_tenant()
    advanced = [
        (pk, decay_usage(usage, (held_milli.get(pk) or 0) / 1000,
                         (now - updated).total_seconds() if updated else 0.0, half_life_s))
        for pk, usage, updated in Tenant.objects.order_by().values_list("pk", "decayed_usage", "usage_updated_at")
    ]
    if not advanced:
        return
    if connection.vendor == "postgresql":
        # One statement for every tenant: bulk_update's CASE per row cost more CPU than the rest of
        # this (tens of ms a cycle at 100 tenants).
        table = connection.ops.quote_name(Tenant._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS tenant SET decayed_usage = advanced.usage, usage_updated_at = %s "
                "FROM unnest(%s::bigint[], %s::float8[]) AS advanced(id, usage) WHERE tenant.id = advanced.id",
                [now, [pk for pk, _ in advanced], [usage for _, usage in advanced]])
    else:
        Tenant.objects.bulk_update([Tenant(pk=pk, decayed_usage=usage, usage_updated_at=now) for pk, usage in advanced],
                                   ["decayed_usage", "usage_updated_at"])


# What the tenants were charged, kept while neither the allocations nor the jobs were written.
_charged = KeptWhileUnchanged(Allocation, Job)


def _charged_milli_by_tenant() -> dict[int, int]:
    """What each tenant is charged for the GPUs it holds now, as the scheduler's core counts it
    (``jobs.scheduling.usage.charged_milli``): a borrower on a GPU whose live allocations request
    more than the whole GPU counts its share of it, everything else its request. One statement,
    the GPU's total taken by a window function (PostgreSQL and SQLite alike), over every live
    allocation (28,000 at 8,192 nodes, 0.2 s of PostgreSQL): not made again while the marks of
    the tables it reads stay where they were."""
    return _charged.get(_read_charged_milli_by_tenant)


def _read_charged_milli_by_tenant() -> dict[int, int]:
    allocations, jobs = Allocation._meta.db_table, Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tenant_id, SUM(CASE WHEN run_class = %s AND on_gpu > 1000 "
            "THEN (gpu_milli * 1000) / on_gpu ELSE gpu_milli END) "
            f"FROM (SELECT job.tenant_id, job.run_class, a.gpu_milli, "
            f"SUM(a.gpu_milli) OVER (PARTITION BY a.gpu_id) AS on_gpu "
            f"FROM {allocations} AS a JOIN {jobs} AS job ON job.id = a.job_id "
            f"WHERE a.released_at IS NULL) AS live GROUP BY tenant_id",
            [RunClass.OPPORTUNISTIC.value])
        return {tenant_id: int(milli) for tenant_id, milli in cursor.fetchall()}
