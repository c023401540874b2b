"""The scheduler core's configuration from the operator's settings (one place for every caller)."""

from django.conf import settings

from jobs.scheduling import SchedulerConfig


def scheduler_config() -> SchedulerConfig:
    return SchedulerConfig(usage_half_life_s=settings.COLONY_USAGE_HALF_LIFE_S,
                           borrower_turnover_gpu_s=settings.COLONY_BORROWER_TURNOVER_GPU_S)
