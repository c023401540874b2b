"""Ask for a scheduling cycle now rather than at the next beat tick, coalescing bursts."""

from __future__ import annotations

import logging

import redis

from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

NUDGE_KEY = "colony:scheduler:nudge"
# Submissions within this window share one extra cycle; the beat tick catches anything missed.
NUDGE_WINDOW_MS = 300


def nudge_scheduler() -> None:
    from jobs.tasks import scheduling_cycle  # tasks import services; import late to avoid a cycle

    try:
        if get_redis().set(NUDGE_KEY, 1, nx=True, px=NUDGE_WINDOW_MS):
            scheduling_cycle.delay()
    except (redis.RedisError, OSError) as exc:
        # The beat tick still runs the cycle; a submission must not fail because of a nudge.
        log.warning("could not nudge the scheduler: %s", exc)
