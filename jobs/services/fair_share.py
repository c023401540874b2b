"""Tenants' decayed GPU usage: advanced once per cycle from what they hold now."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import F, Sum
from django.utils import timezone

from jobs.models import Allocation, Tenant
from jobs.scheduling.usage import decay_usage


def advance_usage(half_life_s: float) -> None:
    now = timezone.now()
    held_milli: dict[int, int] = defaultdict(int)
    for row in (Allocation.objects.filter(released_at__isnull=True).values("job__tenant_id")
                .annotate(milli=Sum(F("gpu_milli")))):
        held_milli[row["job__tenant_id"]] = row["milli"] or 0
    tenants = list(Tenant.objects.all())
    for tenant in tenants:
        elapsed = (now - tenant.usage_updated_at).total_seconds() if tenant.usage_updated_at else 0.0
        tenant.decayed_usage = decay_usage(tenant.decayed_usage, held_milli[tenant.pk] / 1000, elapsed, half_life_s)
        tenant.usage_updated_at = now
    Tenant.objects.bulk_update(tenants, ["decayed_usage", "usage_updated_at"])
