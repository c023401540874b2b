"""One scheduling cycle: snapshot -> pure core -> apply, single-flight under a Redis lock."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings

from jobs.scheduling import decide
from jobs.services.apply import apply_decisions
from jobs.services.snapshot import build_snapshot
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

LOCK_KEY = "colony:scheduler:lock"


@dataclass(frozen=True)
class CycleResult:
    ran: bool
    placed: int = 0
    pending: int = 0
    seconds: float = 0.0


def run_scheduling_cycle() -> CycleResult:
    client = get_redis()
    # The lease bounds how long a crashed worker can block scheduling.
    lock = client.lock(LOCK_KEY, timeout=settings.COLONY_SCHEDULER_LOCK_LEASE, blocking=False)
    if not lock.acquire():
        return CycleResult(ran=False)
    started = time.perf_counter()
    try:
        snapshot = build_snapshot(client)
        decisions = decide(snapshot, now=time.time())
        placed = apply_decisions(decisions)
    finally:
        lock.release()
    result = CycleResult(ran=True, placed=placed, pending=len(decisions.pending),
                         seconds=time.perf_counter() - started)
    if placed:
        log.info("scheduling cycle placed %d job(s), %d pending, %.3fs", placed, result.pending, result.seconds)
    return result
