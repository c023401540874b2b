"""Alerts that need to know allocations and requests: idle GPUs held by jobs, jobs over their
memory request. (XID and thermal alerts are raised by ingest in ``monitoring``.)"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job
from monitoring.choices import AlertKind, Resolution
from monitoring.models import Alert, GpuRollup, JobUsage
from monitoring.services import live
from monitoring.services.alerts import raise_alert, resolve, resolve_cooled
from monitoring.services.redis_client import get_redis

# Rollups must cover this share of the idle window before a GPU is called idle.
MIN_COVERAGE = 0.8


def evaluate() -> int:
    raised = _idle_gpus() + _memory_over_request()
    resolve_cooled(live.latest_gpus(get_redis()), settings.COLONY_ALERT_TEMPERATURE_C)
    return raised


def _idle_gpus() -> int:
    window = timedelta(minutes=settings.COLONY_IDLE_GPU_MINUTES)
    since = timezone.now() - window
    held = list(
        Allocation.objects.filter(released_at__isnull=True, job__state=JobState.RUNNING, created_at__lt=since)
        .select_related("gpu__node")
    )
    usage = {
        row["gpu_id"]: row
        for row in GpuRollup.objects.filter(
            gpu_id__in=[a.gpu_id for a in held], resolution=Resolution.TEN_SECONDS, bucket_start__gte=since
        ).values("gpu_id").annotate(peak=Max("util_max"), buckets=Count("id"))
    }
    enough = window.total_seconds() / Resolution.TEN_SECONDS * MIN_COVERAGE
    threshold = settings.COLONY_IDLE_GPU_UTIL_PERCENT
    idle_now = set()
    for allocation in held:
        row = usage.get(allocation.gpu_id)
        if not row or row["buckets"] < enough or row["peak"] is None or row["peak"] >= threshold:
            continue
        idle_now.add((allocation.gpu_id, allocation.job_id))
        raise_alert(
            AlertKind.IDLE_GPU, node_id=allocation.gpu.node_id, gpu_id=allocation.gpu_id, job_id=allocation.job_id,
            message=(f"{allocation.gpu} held by job {allocation.job_id} under {threshold:.0f}% utilisation "
                     f"for {settings.COLONY_IDLE_GPU_MINUTES:.0f} min"),
            details={"peak_util": row["peak"]},
        )
    for alert in Alert.objects.filter(kind=AlertKind.IDLE_GPU, resolved_at__isnull=True):
        if (alert.gpu_id, alert.job_id) not in idle_now:
            resolve(AlertKind.IDLE_GPU, pk=alert.pk)
    return len(idle_now)


def _memory_over_request() -> int:
    running = {
        job.pk: job
        for job in Job.objects.filter(state=JobState.RUNNING, gpu_memory_mib__isnull=False)
    }
    raised = 0
    for usage in JobUsage.objects.filter(job_id__in=running):
        job = running[usage.job_id]
        if usage.peak_gpu_memory_mib > job.gpu_memory_mib:
            allocation = job.allocations.filter(released_at__isnull=True).select_related("gpu").first()
            if allocation is None:
                continue
            raise_alert(
                AlertKind.MEMORY_OVER_REQUEST, node_id=allocation.gpu.node_id, job_id=job.pk,
                message=(f"Job {job.pk} uses {usage.peak_gpu_memory_mib} MiB per GPU, "
                         f"more than the {job.gpu_memory_mib} MiB it asked for"),
                details={"peak_mib": usage.peak_gpu_memory_mib, "requested_mib": job.gpu_memory_mib},
            )
            raised += 1
    return raised
