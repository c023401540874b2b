"""1 min buckets are derived from 10 s ones; old rollups are pruned."""

from datetime import datetime, timedelta, timezone

from django.utils import timezone as dj_timezone

from monitoring.choices import Resolution
from monitoring.models import GpuRollup, JobRollup
from monitoring.services import retention
from monitoring.services.rollups import compact_minutes

MINUTE = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def test_minute_buckets_sum_their_ten_second_buckets_and_recompute_idempotently(node_n1):
    gpu = node_n1.gpus.get(index=0)
    for i, util in enumerate([10.0, 30.0, 50.0]):
        GpuRollup.objects.create(gpu=gpu, resolution=10, bucket_start=MINUTE + timedelta(seconds=10 * i),
                                 samples=10, util_sum=util * 10, util_n=10, util_max=util, mem_max=100 * (i + 1))
    JobRollup.objects.create(job_id=5, resolution=10, bucket_start=MINUTE, samples=10, mem_max=700)
    for _ in range(2):
        compact_minutes(MINUTE, MINUTE + timedelta(minutes=1))
    minute = GpuRollup.objects.get(resolution=Resolution.ONE_MINUTE)
    assert (minute.samples, minute.util_avg, minute.util_max, minute.mem_max) == (30, 30.0, 50.0, 300)
    assert JobRollup.objects.get(resolution=60).mem_max == 700


def test_prune_keeps_recent_and_drops_old(node_n1, settings):
    settings.COLONY_ROLLUP_RETENTION_10S_HOURS = 24
    gpu = node_n1.gpus.get(index=0)
    now = dj_timezone.now()
    GpuRollup.objects.create(gpu=gpu, resolution=10, bucket_start=now - timedelta(hours=25))
    recent = GpuRollup.objects.create(gpu=gpu, resolution=10, bucket_start=now - timedelta(hours=1))
    GpuRollup.objects.create(gpu=gpu, resolution=60, bucket_start=now - timedelta(hours=25))
    assert retention.prune() == 1
    assert set(GpuRollup.objects.values_list("pk", flat=True)) >= {recent.pk}
    assert GpuRollup.objects.count() == 2
