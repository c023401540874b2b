"""What happens to jobs when nodes disappear and come back.

A node whose heartbeat has stayed expired for a grace (``COLONY_NODE_LOST_GRACE_S``; until then it
is only suspected, :mod:`monitoring.services.health`) is marked LOST and its jobs are requeued
exactly once (the UP -> LOST transition and each job's state change are conditional updates, made by
:mod:`jobs.services.lifecycle`). A running job far past its runtime limit is timed out here too,
a backstop for a node that did not enforce it. When the node talks
again, any process it still runs for a job that no longer belongs there is stopped, so nothing
runs twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone as dt_timezone

import redis
from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models import BooleanField, Case, DateTimeField, ExpressionWrapper, F, Q, When
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import table_changes
from jobs.services.bulk_rows import ids_in
from jobs.scheduling import reasons
from jobs.services import lifecycle
from jobs.services.commands import launch_id, send_duty_cycle, send_query, send_stop
from monitoring.models import Node
from monitoring.services import alerts, health, health_samples, live

log = logging.getLogger(__name__)

# One stop per stray (node, job) per this many seconds, however often it is reported.
STRAY_STOP_EVERY_S = 30
# Hash: "node:job" -> "<sample time the node first failed to list the job> <when that was
# recorded>", for the running jobs a node stopped listing. One read a check, and a write only for
# what changes: a key per job, deleted each time its node listed it, was a DEL of 8,000 keys every
# two seconds. A record older than MISSING_FOR_S is forgotten (the job settled long ago).
MISSING_KEY = "colony:missing"
# A running job its node has stopped reporting for this long is presumed gone (the agent was
# restarted without it) even if the node never answers for it. Long, so that an exit event still
# in the queue is never overtaken; nodes that report attempts are asked and settle far sooner.
VANISHED_AFTER_S = 60.0
MISSING_FOR_S = VANISHED_AFTER_S * 3
# How long after a job's start its node's samples must list it, and how often it is asked.
RECONCILE_AFTER_START_S = 2.0
RECONCILE_EVERY_S = 10
# A placed job not running on its node this long after placement is asked about: one that ran
# and ended there before both its reports were lost answers with its exit; a node that never got
# the launch answers "absent", which changes nothing (the launch is re-sent after 15 s).
RECONCILE_PLACED_AFTER_S = 5


def check_node_health(client: redis.Redis) -> dict:
    global _settled
    gate = Gate.read(client)
    lost = [node.name for node in health.silent_nodes(client, _up_nodes(gate)) if requeue_lost_node(node)]
    if not lost and gate is not None and gate == _settled:
        # Nothing a node says it runs, and no job or allocation, changed since a check that found
        # every node quiet: this one would find the same (quiet holds whatever the clock).
        revived = health.revive_heartbeating(client, health_samples.OnDemand(client), held_jobs)
        return {"lost": lost, "revived": revived, "strays_stopped": 0, "vanished": 0,
                "timed_out": time_out_overdue(), "duty_cycles_resent": 0}
    _settled = None
    samples = health_samples.latest_listings(client)
    revived = health.revive_heartbeating(client, samples, held_jobs)
    strays, vanished, quiet = _reconcile_sampled(client, samples)
    duties, disagreed = _reconcile_duty_cycles(client, samples)
    timed_out = time_out_overdue()
    if quiet and not disagreed and gate is not None and _every_listing_read(client, samples):
        _settled = gate
    return {"lost": lost, "revived": revived, "strays_stopped": strays, "vanished": vanished, "timed_out": timed_out,
            "duty_cycles_resent": duties}


@dataclass(frozen=True)
class Gate:
    """What a check is judged on, as far as it can change without a scan: the token of what every
    node says it runs (``live.LISTING_TOKEN``), the change marks of the jobs and the allocations
    (``table_changes``: any write, by any path), and when this Redis was first seen (a Redis
    restarted empty starts again). A check that found every node quiet, no job missing and no duty
    cycle disagreeing is done again only once one of them moves: at a thousand nodes it read
    8,000 allocations and decoded a thousand samples every two seconds to find that."""

    redis_since: bytes
    listings: bytes
    marks: tuple[str, ...]  # (jobs, allocations, nodes)

    @classmethod
    def read(cls, client: redis.Redis) -> Gate | None:
        """None where any of it is not known (no token yet, a table's triggers gone)."""
        pipe = client.pipeline(transaction=False)
        pipe.set(health.REDIS_SEEN_SINCE_KEY, time.time(), nx=True)  # (as ``silent_nodes`` would, next)
        pipe.mget(health.REDIS_SEEN_SINCE_KEY, live.LISTING_TOKEN)
        since, listings = pipe.execute()[1]
        marks = table_changes.marks([Job, Allocation, Node])
        if since is None or listings is None or None in marks:
            return None
        return cls(since, listings, tuple(marks))


# The gate of the last check that found nothing to do (per process; None: check in full).
_settled: Gate | None = None
# The UP nodes as last read, with the nodes' change mark then: a thousand names read every two
# seconds to find the same ones.
_up: tuple[str | None, list] = (None, [])


def _up_nodes(gate: Gate | None) -> list | None:
    """The UP nodes (``health.up_nodes``), read again only when the nodes' table moved."""
    global _up
    mark = None if gate is None else gate.marks[2]
    if mark is None or mark != _up[0]:
        _up = (mark, health.up_nodes())
    return _up[1]


def _every_listing_read(client: redis.Redis, samples: dict) -> bool:
    """Whether every node with a listing was among the fresh samples this check judged: one whose
    sample was stale now would be judged, unjudged, when it comes back with the same listing."""
    return all((name.decode() if isinstance(name, bytes) else name) in samples
               for name in client.hkeys(live.LISTING_HASH))


def held_jobs(nodes: list[str]) -> dict[str, set[int]]:
    """Node name -> ids of the jobs holding GPUs there now."""
    held: dict[str, set[int]] = {name: set() for name in nodes}
    for name, job_id in Allocation.objects.filter(gpu__node__name__in=nodes, released_at__isnull=True) \
            .values_list("gpu__node__name", "job_id"):
        held[name].add(job_id)
    return held


@transaction.atomic
def requeue_lost_node(node: Node) -> bool:
    if not health.mark_lost(node):
        return False
    job_ids = set(Allocation.objects.filter(gpu__node=node, released_at__isnull=True).values_list("job_id", flat=True))
    # A gang spanning nodes loses every member: requeue_now releases its allocations everywhere.
    requeued = lifecycle.requeue_now(job_ids, reasons.node_lost(node.name))
    alerts.node_lost(node)
    log.warning("node %s lost; requeued jobs %s", node.name, requeued)
    return True


def reconcile_sampled(client: redis.Redis, samples: dict[str, dict]) -> tuple[int, int]:
    """Each sampled node's strays and earlier attempts stopped, its vanished jobs requeued (node by
    node, as :func:`stop_strays`, :func:`stop_earlier_attempts` and :func:`requeue_vanished` do for
    one), from one read of what every one of them holds. Returns (runs stopped, jobs requeued)."""
    strays, vanished, _ = _reconcile_sampled(client, samples)
    return strays, vanished


def _reconcile_sampled(client: redis.Redis, samples: dict[str, dict]) -> tuple[int, int, bool]:
    """:func:`reconcile_sampled`, and whether every node was quiet with no job recorded missing
    (then the check did nothing, and would do nothing again on the same listings and rows)."""
    believed = Believed.read(set(samples), set(), min((entry["ts"] for entry in samples.values()), default=None))
    missing = Missing.read(client)
    # (nodes with a job recorded missing: never quiet, the record must be kept or forgotten)
    recorded = {field.rpartition(":")[0] for field in missing.since}
    launches = {node: _parsed_launches(entry.get("running_launches") or []) for node, entry in samples.items()
                if node in recorded or not believed.quiet(node, entry)}
    quiet_at = believed.version
    quiet = not launches and not missing.since
    # (the attempts of the jobs the other nodes list are those their allocations were read with)
    believed.read_attempts({job_id for attempts in launches.values() for job_id in attempts})
    strays = vanished = 0
    for node, entry in samples.items():
        attempts = launches.get(node)
        if attempts is None:
            # (asked again where this check has changed some node's jobs since: they may be its)
            if believed.version == quiet_at or believed.quiet(node, entry):
                continue
            attempts = launches[node] = _parsed_launches(entry.get("running_launches") or [])
            believed.read_attempts(attempts.keys() - believed.attempts.keys())
        strays += _stop_strays(client, node, entry.get("running_jobs", []), believed)
        strays += _stop_earlier_attempts(client, node, attempts, believed)
        vanished += _requeue_vanished(client, node, entry, believed, missing)
    missing.forget_listed()
    return strays, vanished, quiet and believed.version == quiet_at and not strays and not vanished


# What :class:`Believed` holds for a time well before every sample of the check (most of them):
# a thousand nodes' jobs' start times, parsed one by one, were most of a check's CPU.
EARLIER = "earlier"


def _before(since: datetime | str | None, moment: datetime) -> bool:
    """Whether a time as :class:`Believed` holds it is before ``moment`` (None: no time, never)."""
    return since is EARLIER or (since is not None and since < moment)


@dataclass
class Believed:
    """What the control plane holds on some nodes, read at once for all of them: a check of a
    thousand nodes asked the database four questions per node (2,400 queries every two seconds).
    A job this check changes (started, requeued) is read again before the next node is judged, so
    that each node sees what its own queries used to see."""

    nodes: set[str]
    # Times before this are held as EARLIER: before what any node's sample is compared with.
    cutoff: datetime | None = None
    # node -> jobs with a live allocation there, whatever their state
    held: dict[str, set[int]] = field(default_factory=dict)
    # node -> job -> (attempt, placed_at) of its PLACED jobs; (attempt, started_at) of its RUNNING ones
    placed: dict[str, dict[int, tuple[int, datetime | str | None]]] = field(default_factory=dict)
    running: dict[str, dict[int, tuple[int, datetime | str | None]]] = field(default_factory=dict)
    # job -> its current attempt, for the jobs whose runs the nodes list by attempt
    attempts: dict[int, int] = field(default_factory=dict)
    # Moves whenever ``changed`` reads jobs again (what ``quiet`` said before may no longer hold).
    version: int = 0

    @classmethod
    def read(cls, nodes: set[str], launched: set[int], oldest_sample_ts: float | None = None) -> Believed:
        """``oldest_sample_ts``: the oldest sample the times will be compared with (None: any)."""
        cutoff = None
        if oldest_sample_ts is not None:
            # (the smaller of the two margins the samples are judged with)
            margin = min(RECONCILE_AFTER_START_S, RECONCILE_PLACED_AFTER_S)
            cutoff = datetime.fromtimestamp(oldest_sample_ts - margin, tz=dt_timezone.utc)
        believed = cls(nodes, cutoff)
        believed._read_allocations(None)
        believed._read_attempts(launched)
        return believed

    def quiet(self, node: str, entry) -> bool:
        """Whether a check of ``node`` on its latest sample (``entry``) would do nothing there, as
        most nodes' checks do: it runs exactly the current attempts of the running jobs it holds
        (or, where it lists no attempts, every one of those jobs), no other job, and holds no
        job still placed. Then it has no stray, no earlier attempt and no job missing or to start
        or ask about, whatever the clock (a job it lists is listed however long it has run), and
        its launches need not be parsed nor their attempts read. (A node with a job recorded
        missing is not asked: see ``reconcile_sampled``.)"""
        if self.placed.get(node):
            return False
        running = self.running.get(node, {})
        listed = entry.get("running_jobs") or ()
        launches = entry.get("running_launches")
        if launches is None:
            if not running.keys() <= set(listed):
                return False
        elif len(launches) < len(running) or set(launches) != {
                launch_id(job_id, attempt) for job_id, (attempt, _) in running.items()}:
            return False
        return not listed or set(listed) <= self.held.get(node, set())

    def read_attempts(self, jobs) -> None:
        """Read the current attempts of ``jobs`` too."""
        self._read_attempts(set(jobs))

    def changed(self, jobs: set[int]) -> None:
        """Read ``jobs`` again: this check has just changed them."""
        if not jobs:
            return
        self.version += 1
        for held in self.held.values():
            held.difference_update(jobs)
        for by_job in (*self.placed.values(), *self.running.values()):
            for job_id in jobs:
                by_job.pop(job_id, None)
        self._read_allocations(jobs)
        self._read_attempts(jobs & self.attempts.keys())

    def _read_allocations(self, jobs: set[int] | None) -> None:
        rows = Allocation.objects.filter(released_at__isnull=True)
        if jobs is not None:
            rows = rows.filter(job_id__in=ids_in(jobs))
        elif len(self.nodes) <= FEW_NODES:
            rows = rows.filter(gpu__node__name__in=self.nodes)
        # (else every live allocation, bounded by the GPUs: one condition fewer for the database)
        times = ("job__started_at", "job__placed_at")
        if self.cutoff is not None:
            rows = rows.annotate(**{name: expression for time in times for name, expression in (
                (f"{time}_earlier", ExpressionWrapper(Q(**{f"{time}__lt": self.cutoff}), output_field=BooleanField())),
                (f"{time}_since", Case(When(**{f"{time}__gte": self.cutoff}, then=F(time)), default=None,
                                       output_field=DateTimeField())),
            )})
            columns = [f"{time}_{part}" for time in times for part in ("earlier", "since")]
        else:
            columns = [column for time in times for column in (time, time)]
        rows = rows.values_list("job_id", "gpu__node__name", "job__state", "job__attempt", *columns)
        if connection.vendor == "postgresql":
            # (every live allocation, 8,192 rows at 1,024 nodes, fetched in one go: its columns need
            # no converter, and Django's per-row iteration was a fifth of the check)
            try:
                sql, params = rows.query.sql_with_params()
            except EmptyResultSet:  # (no node or job to read)
                rows = []
            else:
                with connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    rows = cursor.fetchall()
        nodes, held, placed, running = self.nodes, self.held, self.placed, self.running
        for job_id, node, state, attempt, started_earlier, started_since, placed_earlier, placed_since in rows:
            if node not in nodes:
                continue
            jobs_there = held.get(node)
            if jobs_there is None:
                jobs_there = held[node] = set()
            jobs_there.add(job_id)
            if state == _PLACED:
                placed.setdefault(node, {})[job_id] = (attempt, EARLIER if placed_earlier else placed_since)
            elif state == _RUNNING:
                running.setdefault(node, {})[job_id] = (attempt, EARLIER if started_earlier else started_since)

    def _read_attempts(self, jobs: set[int]) -> None:
        if jobs:
            self.attempts.update(Job.objects.filter(pk__in=ids_in(jobs)).values_list("pk", "attempt"))


_PLACED, _RUNNING = JobState.PLACED.value, JobState.RUNNING.value


# Up to this many nodes, their allocations are picked out by the database (a node registering, a
# test); beyond it every live allocation is read.
FEW_NODES = 32


def stop_strays(client: redis.Redis, node: str, running_jobs: list[int]) -> int:
    """Stop processes a node runs for jobs that hold no live allocation on it."""
    if not running_jobs:
        return 0
    return _stop_strays(client, node, running_jobs, Believed.read({node}, set()))


def _stop_strays(client: redis.Redis, node: str, running_jobs: list[int], believed: Believed) -> int:
    if not running_jobs:
        return 0
    stopped = 0
    for job_id in set(running_jobs) - believed.held.get(node, set()):
        if client.set(f"colony:stray:{node}:{job_id}", 1, nx=True, ex=STRAY_STOP_EVERY_S):
            log.warning("node %s runs job %s which does not belong there; stopping it", node, job_id)
            send_stop(node, job_id)
            stopped += 1
    return stopped


def stop_earlier_attempts(client: redis.Redis, node: str, running_launches: list[str]) -> int:
    """Stop runs of an earlier attempt of a job still going on ``node`` (their stop was lost, say
    with a partition) while the job has moved on to a later attempt: such a run would also keep
    the node from starting the job's current attempt there. Each stop names the run it is for."""
    attempts = _parsed_launches(running_launches)
    if not attempts:
        return 0
    return _stop_earlier_attempts(client, node, attempts, Believed.read({node}, set(attempts)))


def _parsed_launches(running_launches: list[str]) -> dict[int, int]:
    """Job id -> the attempt a node says it runs (the last one listed, for a job listed twice)."""
    attempts: dict[int, int] = {}
    for launch in running_launches:
        parsed = _parse_launch_id(launch)
        if parsed is not None:
            attempts[parsed[0]] = parsed[1]
    return attempts


def _parse_launch_id(text: str) -> tuple[int, int] | None:
    parts = text.split("-")
    if len(parts) != 3 or parts[0] != "launch" or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])


def _stop_earlier_attempts(client: redis.Redis, node: str, attempts: dict[int, int], believed: Believed) -> int:
    stopped = 0
    for job_id, running in attempts.items():
        current = believed.attempts.get(job_id)
        if current is None or running >= current:
            continue
        earlier = launch_id(job_id, running)
        if client.set(f"colony:stray:{node}:{earlier}", 1, nx=True, ex=STRAY_STOP_EVERY_S):
            log.warning("node %s still runs %s of job %s, now at attempt %s; stopping that run", node, earlier,
                        job_id, current)
            send_stop(node, job_id, earlier)
            stopped += 1
    return stopped


def resend_duty_cycles(node: str, running_jobs: list[int]) -> int:
    """Tell a node that registered again (after a Redis restart, say) the duty cycle each of its
    running jobs should have: a throttle or un-throttle command lost on the way is not lost for
    good. Commands are idempotent, so repeating one that did arrive costs nothing."""
    desired = dict(
        Allocation.objects.filter(job_id__in=running_jobs, gpu__node__name=node, released_at__isnull=True,
                                  job__state=JobState.RUNNING)
        .values_list("job_id", "duty_cycle").distinct()
    )
    for job_id, duty_cycle in desired.items():
        send_duty_cycle(node, job_id, duty_cycle, resume=True)
    return len(desired)


# A node that runs a job at a higher duty cycle than the stored one is sent the stored one again
# once its samples have said so, about the same stored value, for this long without a gap (a
# throttle the loop has just sent may not have reached the node when it sampled: AIMD moves a
# thousand jobs a cycle), and at most this often a job.
DUTY_DISAGREE_S = 5.0
DUTY_GAP_S = 4.0  # (two checks of the node-health beat)
DUTY_RESEND_EVERY_S = 30
DUTY_MEMORY_S = 120


def reconcile_duty_cycles(client: redis.Redis, samples: dict[str, dict]) -> int:
    """Send again the stored duty cycle of each job that its node (its latest sample, in
    ``samples``) runs faster than that. A throttle or a suspension lost on the way (Redis failing
    over, a pipeline that failed) was re-sent only when the node registered again, and the loop
    sends nothing while the stored value does not move: a job left suspended ran on, full speed,
    beside the guaranteed job it had been suspended for. Only that direction is mended, and never
    by a resume: a job the node runs slower than stored harms no one, and may be meant to (the idle
    policy suspends a job without storing it); a re-send that crosses a newer throttle can then
    only have lowered the job. One query for every node. Returns how many were sent."""
    return _reconcile_duty_cycles(client, samples)[0]


def _reconcile_duty_cycles(client: redis.Redis, samples: dict[str, dict]) -> tuple[int, bool]:
    """:func:`reconcile_duty_cycles`, and whether any job ran faster than stored (then a later
    check may send again on the same listings: it counts how long the disagreement lasts)."""
    if not samples:
        return 0, False
    # Every running job held below full speed (at 1, nothing runs faster: most jobs), and then
    # only the samples of their nodes: a thousand nodes report 8,000 jobs, a few of them throttled.
    stored = set(Allocation.objects.filter(released_at__isnull=True, job__state=JobState.RUNNING,
                                           duty_cycle__lt=1.0)
                 .values_list("job_id", "gpu__node__name", "duty_cycle").distinct())
    reported: dict[tuple[int, str], float] = {}
    sampled_at: dict[str, float] = {}
    for node in {node for _, node, _ in stored}:
        entry = samples.get(node)
        if entry is None:
            continue
        running, duties, at = entry.get("running_jobs") or [], entry.get("duty_cycles") or [], entry.get("ts")
        # (else an agent that does not say)
        if running and len(duties) == len(running) and isinstance(at, (int, float)):
            # (a job at 0 runs no faster than anything stored)
            reported.update(((job_id, node), duty) for job_id, duty in zip(running, duties) if duty)
            sampled_at[node] = at
    faster = sorted((job_id, node, want) for job_id, node, want in stored
                    if isinstance(have := reported.get((job_id, node)), (int, float)) and have > want + 1e-6)
    if not faster:
        return 0, False
    keys = [f"colony:duty-disagree:{node}:{job_id}" for job_id, node, _ in faster]
    resend, pipe = [], client.pipeline(transaction=False)
    for key, (job_id, node, want), before in zip(keys, faster, client.mget(keys)):
        at, seen = sampled_at[node], _disagreement(before)
        if seen is None or seen[0] != want or at - seen[2] > DUTY_GAP_S:  # (first seen, about another value, or anew)
            pipe.set(key, f"{want!r} {at!r} {at!r}", ex=DUTY_MEMORY_S)
        elif at - seen[1] >= DUTY_DISAGREE_S:
            resend.append((job_id, node, want))
            pipe.delete(key)
        else:
            pipe.set(key, f"{want!r} {seen[1]!r} {at!r}", ex=DUTY_MEMORY_S)
    pipe.execute()
    sent = 0
    for job_id, node, want in resend:
        if client.set(f"colony:duty-resent:{node}:{job_id}", 1, nx=True, ex=DUTY_RESEND_EVERY_S):
            log.warning("job %d runs at duty cycle %s on %s, not %s: sending it again", job_id,
                        reported[job_id, node], node, want)
            send_duty_cycle(node, job_id, want)  # (0: a SuspendJob; never a resume)
            sent += 1
    return sent, True


def _disagreement(value: bytes | None) -> tuple[float, float, float] | None:
    """(stored duty cycle, first and last sample times it was seen exceeded) from its key."""
    try:
        want, first, last = (value or b"").split()
        return float(want), float(first), float(last)
    except ValueError:
        return None


def requeue_vanished(client: redis.Redis, node: str, entry: dict) -> int:
    """Reconcile what ``node`` says it runs (its latest sample, ``entry``) with what the control
    plane believes, kubelet-style.

    A RUNNING job whose current attempt the node's sample does not list (taken well after the job
    started, so the start cannot be in flight) has ended there or is unknown there. The node is
    asked about that attempt (:class:`agents.protocol.QueryAttempt`, which changes nothing there,
    at most every ``RECONCILE_EVERY_S``; a stale sample only costs a question): it answers
    with the attempt's exit if it ran and ended there (recovering an exit lost with a trimmed
    stream or a Redis restart), or that it does not know it, which requeues the job at once
    (:func:`jobs.services.lifecycle.finish`). Either way the job is settled within seconds. A
    node that does not report attempts (an older agent), or never answers, has the job requeued
    after ``VANISHED_AFTER_S``.
    """
    missing = Missing.read(client)
    requeued = _requeue_vanished(client, node, entry, Believed.read({node}, set(), entry["ts"]), missing)
    missing.forget_listed()
    return requeued


def _requeue_vanished(client: redis.Redis, node: str, entry: dict, believed: Believed, missing: Missing) -> int:
    """:func:`requeue_vanished` on what ``believed`` holds; ``missing`` is told which jobs the node
    lists again (forgotten by the caller, every node's at once)."""
    sample_ts = entry["ts"]
    reported = set(entry.get("running_jobs", []))
    launches = entry.get("running_launches")
    if launches is not None:
        launches = set(launches)
        if started := _reconcile_placed(client, node, launches, sample_ts, believed):
            believed.changed(started)
    started_before = datetime.fromtimestamp(sample_ts - RECONCILE_AFTER_START_S, tz=dt_timezone.utc)
    ours = [(job_id, attempt) for job_id, (attempt, started_at) in believed.running.get(node, {}).items()
            if _before(started_at, started_before)]
    requeued = 0
    for job_id, attempt in ours:
        field = f"{node}:{job_id}"
        current = launch_id(job_id, attempt)
        if (current in launches) if launches is not None else (job_id in reported):
            missing.listed(field)
            continue
        first_missed = missing.first_missed(field, sample_ts)
        if launches is not None and client.set(f"colony:reconcile:{field}", 1, nx=True, ex=RECONCILE_EVERY_S):
            log.info("node %s does not list job %s's running attempt %s; asking it", node, job_id, current)
            send_query(node, job_id, current)
        if sample_ts - first_missed < VANISHED_AFTER_S:
            continue
        missing.forget(field)
        if _requeue_vanished_job(job_id, node):
            requeued += 1
        believed.changed({job_id})
    return requeued


@dataclass
class Missing:
    """Since when (a sample's time) each node has failed to list each of its running jobs, as
    :data:`MISSING_KEY` holds it; read once a check."""

    client: redis.Redis
    since: dict[str, float]
    listed_again: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, client: redis.Redis) -> Missing:
        now, since, stale = time.time(), {}, []
        for name, value in client.hgetall(MISSING_KEY).items():
            name = name.decode() if isinstance(name, bytes) else name
            record = _missing_record(value)
            if record is None or now - record[1] > MISSING_FOR_S:
                stale.append(name)
            else:
                since[name] = record[0]
        if stale:
            client.hdel(MISSING_KEY, *stale)
        return cls(client, since)

    def first_missed(self, job_on_node: str, sample_ts: float) -> float:
        """When the node first failed to list it: this sample's time, unless recorded before."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(MISSING_KEY, job_on_node, f"{sample_ts!r} {time.time()!r}")
        pipe.hget(MISSING_KEY, job_on_node)
        record = _missing_record(pipe.execute()[1])
        return record[0] if record else sample_ts

    def listed(self, job_on_node: str) -> None:
        if job_on_node in self.since:
            self.listed_again.append(job_on_node)

    def forget(self, job_on_node: str) -> None:
        self.client.hdel(MISSING_KEY, job_on_node)
        self.since.pop(job_on_node, None)

    def forget_listed(self) -> None:
        if self.listed_again:
            self.client.hdel(MISSING_KEY, *self.listed_again)


def _missing_record(value: bytes | str | None) -> tuple[float, float] | None:
    try:
        first, recorded = (value.decode() if isinstance(value, bytes) else value or "").split()
        return float(first), float(recorded)
    except ValueError:
        return None


def _reconcile_placed(client: redis.Redis, node: str, launches: set[str], sample_ts: float,
                      believed: Believed) -> set[int]:
    """PLACED jobs whose start report was lost: one the node runs is started now; one placed a
    while ago that it does not run is asked about (it may have run and ended there, both its
    reports lost; a launch that never arrived is re-sent by the scheduling loop meanwhile).
    Returns the jobs it tried to start (the caller reads them again)."""
    # Judged by the sample's own time: a sample taken before (or just after) the placement says
    # nothing about whether the launch arrived.
    placed_before = datetime.fromtimestamp(sample_ts - RECONCILE_PLACED_AFTER_S, tz=dt_timezone.utc)
    started = set()
    for job_id, (attempt, placed_at) in list(believed.placed.get(node, {}).items()):
        current = launch_id(job_id, attempt)
        if current in launches:
            started.add(job_id)
            if lifecycle.start(job_id, node, current, datetime.fromtimestamp(sample_ts, tz=dt_timezone.utc)):
                log.warning("job %s runs on node %s but its start report was lost; now RUNNING", job_id, node)
        elif _before(placed_at, placed_before) and client.set(
                f"colony:reconcile:{node}:{job_id}", 1, nx=True, ex=RECONCILE_EVERY_S):
            send_query(node, job_id, current)
    return started


def _requeue_vanished_job(job_id: int, node: str) -> bool:
    requeued = lifecycle.requeue_now([job_id], reasons.vanished_from_node(node, asked=False), only_running=True)
    if requeued:
        log.warning("job %s vanished from node %s; requeued", job_id, node)
    return bool(requeued)


# The control plane's backstop stops a job this long past its runtime limit and stop grace: its
# node enforces the limit itself and reports the exit first, unless it could not.
TIMEOUT_BACKSTOP_SLACK_S = 30.0


def time_out_overdue(now=None) -> list[int]:
    """End RUNNING jobs that ran well past their ``max_runtime_s`` (TIMEOUT), telling their
    nodes to stop them. The database is asked for those past their limit, one condition per limit
    in use (a few: limits are round numbers), rather than doing date arithmetic in SQL that
    SQLite and PostgreSQL spell differently; with many limits in use, every running job with one
    is read (bounded by the GPUs)."""
    now = now or timezone.now()
    slack = settings.COLONY_STOP_GRACE_SECONDS + TIMEOUT_BACKSTOP_SLACK_S
    limited = Job.objects.filter(state=JobState.RUNNING, max_runtime_s__isnull=False, started_at__isnull=False)
    limits = set(limited.order_by().values_list("max_runtime_s", flat=True).distinct())
    if not limits:
        return []
    if len(limits) <= FEW_LIMITS:
        # (a thousand start times parsed every two seconds to find none overdue cost more than asking)
        overdue_now = Q()
        for limit in limits:
            overdue_now |= Q(max_runtime_s=limit, started_at__lt=now - timezone.timedelta(seconds=limit + slack))
        limited = limited.filter(overdue_now)
    overdue = []
    for job_id, started_at, limit in limited.values_list("pk", "started_at", "max_runtime_s"):
        allowed = timezone.timedelta(seconds=limit + slack)
        if started_at + allowed < now and lifecycle.time_out(job_id, started_before=now - allowed):
            overdue.append(job_id)
    return overdue


# Up to this many different runtime limits, the database picks the overdue jobs out.
FEW_LIMITS = 50
