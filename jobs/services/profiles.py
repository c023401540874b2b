"""Job profiles (after Nimble): what a ``profile_key`` used when it ran, kept as a running mean
so later jobs with the key are placed from it rather than from their request."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from jobs.models import Allocation, Job, JobProfile
from monitoring.models import Gpu, JobUsage


@transaction.atomic
def record_profile(job_id: int) -> JobProfile | None:
    """Fold a successfully finished job's observed usage into its key's profile."""
    job = Job.objects.get(pk=job_id)
    usage = JobUsage.objects.filter(job_id=job_id).first()
    if not job.profile_key or usage is None or not usage.peak_gpu_memory_mib:
        return None
    # What a node reported is untrusted: a run's peak is never above the largest GPU it was given
    # (a node claiming 16 TiB must not make the key unplaceable for good).
    largest_held = Allocation.objects.filter(job_id=job_id).aggregate(m=Max("gpu__memory_mib"))["m"]
    cap = largest_held or _largest_gpu_mib()
    peak = min(usage.peak_gpu_memory_mib, cap) if cap else usage.peak_gpu_memory_mib
    runtime = (job.finished_at - job.started_at).total_seconds() if job.started_at and job.finished_at else None
    util = usage.mean_util / 100.0 if usage.mean_util is not None else None
    profile, created = JobProfile.objects.select_for_update().get_or_create(
        tenant=job.tenant, key=job.profile_key,
        defaults={"runs": 1, "peak_gpu_memory_mib": peak, "mean_util": util, "util_runs": int(util is not None),
                  "mean_runtime_s": runtime},
    )
    if created:
        return profile
    runs = profile.runs + 1
    # Peak memory keeps the largest seen (a placement must fit the worst run); the rest average.
    # A stored peak no GPU in the cluster has (recorded before readings were bounded) heals here.
    profile.peak_gpu_memory_mib = max(min(profile.peak_gpu_memory_mib, _largest_gpu_mib() or peak), peak)
    profile.mean_util = _mean(profile.mean_util, util, profile.util_runs)
    profile.util_runs += util is not None
    profile.mean_runtime_s = _mean(profile.mean_runtime_s, runtime, profile.runs)
    profile.runs = runs
    profile.save()
    return profile


def _largest_gpu_mib() -> int | None:
    return Gpu.objects.filter(present=True).aggregate(m=Max("memory_mib"))["m"]


def _mean(previous: float | None, new: float | None, count: int) -> float | None:
    if new is None:
        return previous
    if previous is None:
        return new
    return previous + (new - previous) / (count + 1)
