"""Alerts that need allocations: idle GPUs held by running jobs, jobs over their memory request."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.alerts import evaluate
from monitoring.choices import AlertKind
from monitoring.models import Alert, GpuRollup, JobUsage
from tests.factories import GpuFactory, JobFactory


@pytest.fixture
def held_gpu(db, live_redis, settings):
    settings.COLONY_IDLE_GPU_MINUTES = 10
    gpu = GpuFactory(node__name="n1", index=3)
    job = JobFactory(state=JobState.RUNNING, gpu_memory_mib=10_000)
    allocation = Allocation.objects.create(job=job, gpu=gpu)
    Allocation.objects.filter(pk=allocation.pk).update(created_at=timezone.now() - timedelta(minutes=20))
    return gpu, job


def fill_rollups(gpu, util_max, minutes=10):
    now = timezone.now()
    GpuRollup.objects.bulk_create([
        GpuRollup(gpu=gpu, resolution=10, bucket_start=now - timedelta(seconds=10 * i), samples=10,
                  util_sum=util_max * 10, util_n=10, util_max=util_max)
        for i in range(minutes * 6 - 1)
    ])


def test_gpu_held_but_idle_for_the_window_raises_one_alert(held_gpu):
    gpu, job = held_gpu
    fill_rollups(gpu, util_max=1.0)
    evaluate()
    evaluate()
    (alert,) = Alert.objects.filter(kind=AlertKind.IDLE_GPU)
    assert alert.job_id == job.pk and alert.gpu == gpu and alert.resolved_at is None
    assert "n1/gpu3" in alert.message


def test_busy_gpu_or_thin_data_raises_nothing(held_gpu):
    gpu, _ = held_gpu
    fill_rollups(gpu, util_max=60.0)
    evaluate()
    assert not Alert.objects.filter(kind=AlertKind.IDLE_GPU).exists()


def test_idle_alert_resolves_when_the_job_ends(held_gpu):
    gpu, job = held_gpu
    fill_rollups(gpu, util_max=0.0)
    evaluate()
    job.state = JobState.SUCCEEDED
    job.save()
    evaluate()
    assert Alert.objects.get(kind=AlertKind.IDLE_GPU).resolved_at is not None


def test_job_over_its_memory_request(held_gpu):
    _, job = held_gpu
    now = timezone.now()
    JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=12_000, first_seen_at=now, last_seen_at=now)
    evaluate()
    alert = Alert.objects.get(kind=AlertKind.MEMORY_OVER_REQUEST)
    assert "12000 MiB" in alert.message and "10000 MiB" in alert.message
