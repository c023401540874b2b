"""The operator's turnover threshold reaches the scheduler core."""

from jobs.services.scheduler_config import scheduler_config


def test_the_turnover_threshold_comes_from_the_settings(settings):
    settings.COLONY_BORROWER_TURNOVER_GPU_S = 0.0
    assert scheduler_config().borrower_turnover_gpu_s == 0.0
    settings.COLONY_BORROWER_TURNOVER_GPU_S = 7200.0
    assert scheduler_config().borrower_turnover_gpu_s == 7200.0
