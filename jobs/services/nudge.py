"""Ask for a scheduling cycle now rather than at the next beat tick, coalescing bursts."""

from __future__ import annotations

import logging
import time

import redis

from jobs.services.enqueue import enqueue
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

NUDGE_KEY = "colony:scheduler:nudge"
# Submissions within this window share one extra cycle; the beat tick catches anything missed.
NUDGE_WINDOW_MS = 300

# When this process last set the key (monotonic seconds). Nobody deletes it before it expires, so
# until then another SET NX could only fail: a burst of submissions asks Redis once per window.
_set_at = float("-inf")
_clock = time.monotonic


def nudge_scheduler() -> None:
    global _set_at
    now = _clock()
    if (now - _set_at) * 1000 < NUDGE_WINDOW_MS:
        return
    try:
        if get_redis().set(NUDGE_KEY, 1, nx=True, px=NUDGE_WINDOW_MS):
            _set_at = now
            enqueue("scheduling_cycle")
    except (redis.RedisError, OSError) as exc:
        # The beat tick still runs the cycle; a submission must not fail because of a nudge.
        log.warning("could not nudge the scheduler: %s", exc)
