"""Rollup compaction (10 s -> 1 min) and pruning by age."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from monitoring.choices import Resolution
from monitoring.models import GpuRollup, JobRollup
from monitoring.services.rollups import compact_minutes


def compact_recent(minutes: int = 3) -> int:
    """Recompute the last few complete minutes (idempotent, so overlapping runs are harmless)."""
    until = timezone.now().replace(second=0, microsecond=0)
    return compact_minutes(until - timedelta(minutes=minutes), until)


def prune() -> int:
    now = timezone.now()
    cutoffs = {
        Resolution.TEN_SECONDS: now - timedelta(hours=settings.COLONY_ROLLUP_RETENTION_10S_HOURS),
        Resolution.ONE_MINUTE: now - timedelta(days=settings.COLONY_ROLLUP_RETENTION_1M_DAYS),
    }
    deleted = 0
    for model in (GpuRollup, JobRollup):
        for resolution, cutoff in cutoffs.items():
            deleted += model.objects.filter(resolution=resolution, bucket_start__lt=cutoff).delete()[0]
    return deleted
