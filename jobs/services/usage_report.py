"""GPU use per tenant as the API and the usage page report it: tenants now (with which are the
reader's), GPU-hours per tenant per UTC day."""

from __future__ import annotations

from jobs.services.submission import tenants_of
from jobs.services.gpu_usage import TenantNow, gpu_hours_by_day, tenants_now

MAX_REPORT_DAYS = 92


def tenant_rows(user) -> tuple[list[TenantNow], dict]:
    return tenants_now(), {"mine": set(tenants_of(user).values_list("pk", flat=True))}


def usage_rows(days: int, tenant: str | None = None) -> list[dict]:
    return [
        {
            "day": row.day, "tenant": row.tenant,
            "guaranteed_gpu_hours": round(row.guaranteed_gpu_hours, 3),
            "opportunistic_gpu_hours": round(row.opportunistic_gpu_hours, 3),
            "total_gpu_hours": round(row.total_gpu_hours, 3),
        }
        for row in gpu_hours_by_day(days, tenant_slugs=tenant.split(",") if tenant else None)
    ]
