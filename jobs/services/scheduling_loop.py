"""One scheduling cycle: usage -> snapshot -> pure core -> apply, single-flight under a Redis lock.

Where it runs: beat's tick is routed to the Celery queue ``scheduler`` (``CELERY_TASK_ROUTES``),
which only the scheduler worker consumes, started with ``--pool solo -Q scheduler`` (the devstack's
``scheduler`` child, compose's ``scheduler`` service). So one long-lived process runs every cycle
of a deployment and keeps what lives between cycles (``_carry``, the snapshot loader's rows):
under a prefork pool the tick went to either child, the lease bounced between them (a new epoch
each time, with no failover) and each child paid its own cold cycle. A second scheduler process
(another host) is still a standby: it takes over through the lease when the first dies.

The leader keeps its lease between cycles: a cycle that ends well leaves it held (its fenced
apply has just renewed it for a whole lease) and the next tick renews it again, so the epoch
moves only when another process takes the lease over, which it can do only once the leader
stopped ticking for a whole lease (dead, stopped, partitioned) or handed it back (a warm shutdown,
:func:`hand_back_on_shutdown`; a cycle that failed with an error). Handing it back after every
cycle, as before, let the lease alternate between two scheduler processes, each handover a new
epoch on ``colony_scheduler_leader_epoch`` with no failover behind it. The price: a leader that
dies *between* cycles is now waited for (at most one lease) before a standby takes over.

A cycle that outlives its lease: while a cycle holds the lease, a small thread renews it
(:class:`leadership.LeaseKeeper`, every third of the lease). Sizing the lease from measured
cycles instead would make failover as slow as the slowest cycle ever seen and still fail on the
first cycle slower than that (a cold one under load ran 69 s against a 30 s lease, and its 2,704
placements were fenced and computed again). A renewal thread is safe where a timer elsewhere
would not be: a stopped process stops all its threads, so a paused leader still loses its lease
and its late writes stay fenced by epoch; a renewal never waits on a lock in the server, so one
sent before a pause cannot land after it; a cycle hung with its process running is renewed for
``COLONY_SCHEDULER_MAX_CYCLE_S`` at most. The keeper also extends the Redis lock, so that no
other process starts a cycle only to find the lease held.

Any number of scheduler processes may run cycles. The Redis lock keeps them from wasting work on
simultaneous cycles; what makes a late writer harmless is the lease in the database
(:mod:`jobs.services.leadership`): each cycle takes it, and writes its usage and its decisions only
inside :func:`leadership.fenced` transactions, which commit nothing once another process has taken
the lease over. A process paused past its lease (SIGSTOP, a long GC, a stalled VM) therefore wakes
up to find its decisions refused and logged, never applied on top of the new leader's.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

import redis
from celery import signals
from django.conf import settings
from django.db import DatabaseError, InterfaceError, InternalError, OperationalError
from django.utils import timezone

from jobs.scheduling import Decisions, decide
from jobs.scheduling.carry import Carry
from jobs.services import avoided_nodes, leadership
from jobs.services.apply import apply_decisions, resend_stops, resend_unstarted_launches
from jobs.services.scheduler_config import scheduler_config
from jobs.services.service_meter import ServiceMeter
from jobs.services.fair_share import advance_usage
from jobs.services.snapshot_loader import build_snapshot, checked_snapshot, last_pending_step
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

LOCK_KEY = "colony:scheduler:lock"
# While the database is unreachable, cycles are skipped for a doubling pause (capped) instead of
# failing every tick; the first cycle that succeeds clears it.
BACKOFF_KEY = "colony:scheduler:backoff"
BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 60.0
# What /metrics says of the loop (jobs/metrics.py): cycles run, their seconds, the last one's.
STATS_KEY = "colony:scheduler:stats"
# What this process's cycles leave for its next one (sorted queues, request shapes): it only ever
# answers as a cycle without it would, so a stale one (another process led meanwhile) is harmless.
_carry = Carry()
# Each running job's service in this run, measured at the speed it ran (turnover ranks by it).
_service = ServiceMeter()
STAGES = ("usage", "snapshot", "decide", "apply", "resend")
# Every this many cycles of a process (~5 minutes at the 2 s interval), the snapshot built from
# what the loader kept between cycles is checked against one built afresh (twice a snapshot's
# cost, once): a cache bug is then logged, counted for /metrics and dropped, not steering the
# scheduler for as long as the process lives.
SNAPSHOT_CHECK_EVERY = 150
_cycles_unchecked = 0


@dataclass(frozen=True)
class CycleResult:
    ran: bool
    placed: int = 0
    preempted: int = 0
    throttled: int = 0
    pending: int = 0
    seconds: float = 0.0
    backed_off: bool = False
    # Its decisions were refused: another process had taken the scheduler lease over meanwhile.
    fenced: bool = False
    # Wall seconds of each stage (STAGES), for /metrics: where a slow cycle's time went.
    stages: dict[str, float] = field(default_factory=dict)


def run_scheduling_cycle() -> CycleResult:
    # A cycle allocates some 10^5 objects that live until it ends (snapshot, decisions), and each
    # collection they trigger scans them all again: up to a quarter of a cycle's CPU at 50,000
    # pending jobs. The collector is paused for the cycle and switched back on only once the
    # cycle's own objects are gone (``_cycle`` has returned).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _cycle()
    finally:
        if collecting:
            _freeze_what_lives_on()
            gc.enable()


# What lives on from cycle to cycle (the loader's rows and requests, the carry: some 275,000
# objects at 1,024 nodes) made every full pass of the collector ~130 ms, most cycles, charged to
# whatever ran next. A cycle leaves almost nothing that only the collector can free (3 objects in
# the loop bench), so after each cycle what lives is frozen (passed over by the collector, still
# freed as usual when its last reference goes); every FULL_COLLECTION_EVERY cycles it is thawed
# and collected once, so garbage in reference cycles lives at most that long.
FULL_COLLECTION_EVERY = 150
_cycles_since_collection = FULL_COLLECTION_EVERY // 2  # (half a period off the snapshot check's)


def _freeze_what_lives_on() -> None:
    global _cycles_since_collection
    _cycles_since_collection += 1
    if _cycles_since_collection >= FULL_COLLECTION_EVERY:
        _cycles_since_collection = 0
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def _cycle() -> CycleResult:
    client = get_redis()
    if client.exists(BACKOFF_KEY):
        return CycleResult(ran=False, backed_off=True)
    lease_s = settings.COLONY_SCHEDULER_LOCK_LEASE
    # The lease bounds how long a crashed worker can block scheduling.
    # Not thread-local: the lease keeper's thread extends it while a slow cycle runs.
    lock = client.lock(LOCK_KEY, timeout=lease_s, blocking=False, thread_local=False)
    if not lock.acquire():
        return CycleResult(ran=False)
    started = time.perf_counter()
    lease = decisions = keeper = None
    keep_lease = False
    try:
        lease = leadership.acquire(lease_s)
        if lease is None:
            return CycleResult(ran=False)
        keeper = leadership.LeaseKeeper(lease, lease_s, settings.COLONY_SCHEDULER_MAX_CYCLE_S,
                                        also=lambda: _extend(lock))
        keeper.start()
        if lease.took_over_from:
            log.warning("scheduler lease taken over from %s, whose lease expired without being handed back "
                        "(it died or stopped; epoch %d begins)", lease.took_over_from, lease.epoch)
            _count(client, "takeovers")
        config = scheduler_config()
        clock = _StageClock()
        with leadership.fenced(lease, lease_s):
            advance_usage(config.usage_half_life_s)
        clock.lap("usage")
        snapshot = _snapshot(client)
        _carry.pending_step(*last_pending_step())
        now = time.time()
        snapshot = _service.measured(snapshot, now)
        clock.lap("snapshot")
        keeper.check()
        # (Jobs kept off a node for a while, a launch failed or an idle requeue there, are decided last.)
        decisions = avoided_nodes.decide_avoiding(snapshot, now, config, _carry, client, decide=decide)
        clock.lap("decide")
        keeper.check()
        # Taken before applying: a slow cycle must not re-send the launches it has just sent.
        applying_at = timezone.now()
        with leadership.fenced(lease, lease_s):
            applied = apply_decisions(decisions, snapshot.pending)
        clock.lap("apply")
        resend_unstarted_launches(client, as_of=applying_at, skip={place.job_id for place in decisions.placements})
        resend_stops(client)
        clock.lap("resend")
        client.delete(BACKOFF_KEY + ":next")
        keep_lease = True
    except leadership.Superseded as exc:
        return _refused(client, decisions, str(exc))
    except (OperationalError, InterfaceError, InternalError) as exc:
        if leadership.session_ended_while_idle(exc):
            return _refused(client, decisions, f"the database ended this paused scheduler's transaction ({exc})")
        if isinstance(exc, InternalError):
            raise
        pause = min(BACKOFF_MAX_S, float(client.get(BACKOFF_KEY + ":next") or BACKOFF_FIRST_S))
        client.set(BACKOFF_KEY, 1, px=int(pause * 1000))
        client.set(BACKOFF_KEY + ":next", min(BACKOFF_MAX_S, pause * 2), ex=int(BACKOFF_MAX_S * 4))
        log.error("database unavailable (%s); pausing the scheduler for %.0fs", exc, pause)
        return CycleResult(ran=False, backed_off=True)
    finally:
        if keeper is not None:
            keeper.stop()  # before the lease is handed back: no renewal after it
        if keep_lease:
            _held.lease = lease  # renewed by the next tick; handed back only at a warm shutdown
        elif lease is not None:
            _hand_back(lease, lease_s)
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("scheduling cycle outlived its %ss lease", lease_s)
    result = CycleResult(ran=True, placed=applied.placed, preempted=applied.preempted, throttled=applied.throttled,
                         pending=len(decisions.pending), seconds=time.perf_counter() - started, stages=clock.seconds)
    _record(client, result)
    if applied.placed or applied.preempted:
        log.info("scheduling cycle: %s", result)
    return result


class _Held:
    """The lease this process keeps between cycles, to hand back when it shuts down warm."""

    lease: leadership.Lease | None = None


_held = _Held()


def _hand_back(lease: leadership.Lease, lease_s: float) -> None:
    try:
        leadership.release(lease)
    except DatabaseError as exc:
        log.warning("scheduler lease not handed back (%s); it expires in %ss", exc, lease_s)


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def hand_back_on_shutdown(**_kwargs) -> None:
    """A scheduler stopped warm (a deploy, systemd stop) hands its lease back, so that a standby
    takes over at its next tick instead of waiting for the lease to run out. (A process killed or
    stopped cannot: its lease expires, and that is a takeover.)"""
    lease, _held.lease = _held.lease, None
    if lease is not None:
        _hand_back(lease, settings.COLONY_SCHEDULER_LOCK_LEASE)


def _extend(lock) -> None:
    try:
        lock.reacquire()
    except (redis.RedisError, redis.exceptions.LockError) as exc:
        log.warning("scheduler lock not extended (%s)", exc)


def _snapshot(client: redis.Redis):
    global _cycles_unchecked
    _cycles_unchecked += 1
    if _cycles_unchecked < SNAPSHOT_CHECK_EVERY:
        return build_snapshot(client)
    _cycles_unchecked = 0
    snapshot, differ = checked_snapshot(client)
    if differ:
        log.error("the snapshot built from what the loader kept between cycles differed from one built afresh "
                  "(%s): a bug; this cycle uses the fresh one, and the loader starts again from it", ", ".join(differ))
        _count(client, "snapshot_divergences")
    return snapshot


class _StageClock:
    """Wall seconds from one lap to the next, by stage name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = now - self._since
        self._since = now


def _refused(client: redis.Redis, decisions: Decisions | None, why: str) -> CycleResult:
    """A cycle whose lease passed to another process while it ran: it wrote nothing; say what it
    would have done, so that an operator can see what the fence kept out."""
    placed = [place.job_id for place in decisions.placements] if decisions else []
    preempted = [preempt.job_id for preempt in decisions.preemptions] if decisions else []
    log.warning("scheduling cycle fenced off, nothing of it was applied: %s; refused placements of jobs %s and "
                "preemptions of jobs %s", why, placed, preempted)
    _count(client, "fenced")
    return CycleResult(ran=False, fenced=True)


def _count(client: redis.Redis, counter: str) -> None:
    try:
        client.hincrby(STATS_KEY, counter, 1)
    except redis.RedisError as exc:
        log.warning("scheduler stats not recorded: %s", exc)


def _record(client: redis.Redis, result: CycleResult) -> None:
    """Counters for /metrics, so a stalled or slow loop can alert. Never fails the cycle."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.hset(STATS_KEY, mapping={"last_cycle_at": time.time(), "last_cycle_seconds": result.seconds,
                                      "last_pending": result.pending,
                                      **{f"last_stage_seconds:{stage}": s for stage, s in result.stages.items()}})
        pipe.hincrby(STATS_KEY, "cycles", 1)
        pipe.hincrbyfloat(STATS_KEY, "cycle_seconds", result.seconds)
        pipe.hincrby(STATS_KEY, "placed", result.placed)
        for stage, seconds in result.stages.items():
            pipe.hincrbyfloat(STATS_KEY, f"stage_seconds:{stage}", seconds)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("scheduler stats not recorded: %s", exc)
