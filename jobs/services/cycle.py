"""One scheduling cycle: usage -> snapshot -> pure core -> apply, single-flight under a Redis lock."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from jobs.scheduling import decide
from jobs.scheduling.config import SchedulerConfig
from jobs.services.apply import apply_decisions, resend_unstarted_launches
from jobs.services.fair_share import advance_usage
from jobs.services.snapshot import build_snapshot
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

LOCK_KEY = "colony:scheduler:lock"


@dataclass(frozen=True)
class CycleResult:
    ran: bool
    placed: int = 0
    preempted: int = 0
    throttled: int = 0
    pending: int = 0
    seconds: float = 0.0


def scheduler_config() -> SchedulerConfig:
    return SchedulerConfig(usage_half_life_s=settings.COLONY_USAGE_HALF_LIFE_S)


def run_scheduling_cycle() -> CycleResult:
    client = get_redis()
    # The lease bounds how long a crashed worker can block scheduling.
    lock = client.lock(LOCK_KEY, timeout=settings.COLONY_SCHEDULER_LOCK_LEASE, blocking=False)
    if not lock.acquire():
        return CycleResult(ran=False)
    started = time.perf_counter()
    try:
        config = scheduler_config()
        advance_usage(config.usage_half_life_s)
        snapshot = build_snapshot(client)
        decisions = decide(snapshot, now=time.time(), config=config)
        applied = apply_decisions(decisions)
        resend_unstarted_launches(client)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("scheduling cycle outlived its %ss lease", settings.COLONY_SCHEDULER_LOCK_LEASE)
    result = CycleResult(ran=True, placed=applied.placed, preempted=applied.preempted, throttled=applied.throttled,
                         pending=len(decisions.pending), seconds=time.perf_counter() - started)
    if applied.placed or applied.preempted:
        log.info("scheduling cycle: %s", result)
    return result
