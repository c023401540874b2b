"""Nodes a pending job must not go back to for a while, and the step of the scheduling cycle that
keeps it off them.

Who sets them: :mod:`jobs.services.launch_failures` (its launch failed there for a reason of that
node's: no such account, no interpreter, a cgroup that could not be made) and
:mod:`jobs.services.idle_reclaim` (it was requeued for idling there, so that the job waiting for
that GPU gets it instead of the idle one going straight back).

Why here and not a filter in the core: ``JobRequest`` has no field for it and the pure core
(:mod:`jobs.scheduling`) is not touched by this change. So the cycle decides in two passes
(:func:`decide_avoiding`), only while some pending job holds a mark: first the core decides for
every other pending job, as usual (so the job waiting for the GPU an idle job was taken from gets
it, rather than the idle job, often first in the queue, taking it straight back); then each
marked job alone, on the same snapshot with the nodes it avoids cordoned and every GPU of the
first pass's placements taken. That placement is kept only when all its GPUs are free outright
(nothing runs on them, nothing is placed or promised there), so the second pass can never hand a
GPU out twice or count on a preemption it did not make. A marked job thus goes after the others
for as long as its mark lasts, and takes nothing by reclaim meanwhile.

The marks live in one Redis hash (``<job>:<node>`` -> when the mark ends), read once a cycle and
pruned as they lapse: a handful of entries, never one per pending job. A mark lost with Redis
costs at most one retry on that node; what bounds retries (:mod:`jobs.services.launch_failures`)
is counted on the job's timeline, not here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict

import redis

from jobs.scheduling import Decisions, decide
from jobs.scheduling.decisions import Place
from jobs.scheduling.snapshot import ClusterSnapshot, RunningJob

log = logging.getLogger(__name__)

AVOID_KEY = "colony:scheduler:avoided_nodes"


def avoid(client: redis.Redis, job_id: int, node: str, seconds: float) -> None:
    """Keep ``job_id`` off ``node`` for ``seconds`` from now."""
    try:
        client.hset(AVOID_KEY, f"{job_id}:{node}", time.time() + seconds)
    except redis.RedisError as exc:
        log.warning("job %s may go back to %s: its avoidance was not stored (%s)", job_id, node, exc)


def avoided(client: redis.Redis, now: float | None = None) -> dict[int, frozenset[str]]:
    """Every pending mark by job; lapsed ones are dropped from the hash."""
    now = time.time() if now is None else now
    marks: dict[int, set[str]] = defaultdict(set)
    lapsed = []
    for field, until in client.hgetall(AVOID_KEY).items():
        field = field.decode() if isinstance(field, bytes) else field
        job, _, node = field.partition(":")
        if float(until) <= now:
            lapsed.append(field)
        elif job.isdigit():
            marks[int(job)].add(node)
    if lapsed:
        client.hdel(AVOID_KEY, *lapsed)
    return {job: frozenset(nodes) for job, nodes in marks.items()}


def forget(client: redis.Redis, job_id: int) -> None:
    """The job ended: its marks go with it."""
    try:
        fields = [f for f in client.hkeys(AVOID_KEY) if (f.decode() if isinstance(f, bytes) else f)
                  .startswith(f"{job_id}:")]
        if fields:
            client.hdel(AVOID_KEY, *fields)
    except redis.RedisError:
        pass  # they lapse on their own


def decide_avoiding(snapshot: ClusterSnapshot, now: float, config, carry, client: redis.Redis,
                    decide=decide) -> Decisions:
    """The cycle's decisions, with no job placed on a node it avoids (see the module docstring).
    ``decide``: the core's, as the loop holds it (tests stand in for it there)."""
    try:
        marks = avoided(client, now)
    except redis.RedisError as exc:
        log.warning("avoided nodes not read this cycle (%s)", exc)
        marks = {}
    held = [request for request in snapshot.pending if request.id in marks] if marks else []
    if not held:
        return decide(snapshot, now=now, config=config, carry=carry)  # (nearly every cycle)
    ids = {request.id for request in held}
    others = dataclasses.replace(snapshot, pending=tuple(r for r in snapshot.pending if r.id not in ids),
                                 promises=tuple(p for p in snapshot.promises if p.job_id not in ids))
    decisions = decide(others, now=now, config=config, carry=carry)
    placements, pending = list(decisions.placements), list(decisions.pending)
    requests = {request.id: request for request in snapshot.pending}
    for request in held:  # (in queue order, as the snapshot lists them)
        again = _decide_elsewhere(others, placements, requests, request, marks[request.id], now, config, decide)
        if isinstance(again, Place):
            placements.append(again)
            log.info("job %s placed on %s, off the node(s) it avoids (%s)", request.id, again.node,
                     ", ".join(sorted(marks[request.id])))
        elif again is not None:
            pending.append(again)
    return dataclasses.replace(decisions, placements=tuple(placements), pending=tuple(pending))


def _decide_elsewhere(snapshot, placements, requests, request, nodes, now, config, decide):
    """A ``Place`` for ``request`` off ``nodes`` on GPUs free outright, its ``Pending`` when the
    core says why it waits, else None."""
    job_id = request.id
    taken = {gpu_id for place in placements for part in place.slices for gpu_id in part.gpu_ids}
    taken |= {gpu_id for running in snapshot.running for gpu_id in running.gpu_ids}
    taken |= {gpu_id for promise in snapshot.promises for gpu_id in promise.gpu_ids}
    placed_now = tuple(
        RunningJob(id=place.job_id, tenant=requests[place.job_id].tenant, job_class=place.job_class,
                   gpu_ids=tuple(g for part in place.slices for g in part.gpu_ids), started_at=now,
                   memory_mib=place.memory_limit_mib, gpu_milli=place.gpu_milli,
                   priority=requests[place.job_id].priority, user=requests[place.job_id].user,
                   cpu_milli=requests[place.job_id].cpu_milli, host_memory_mb=requests[place.job_id].host_memory_mb)
        for place in placements if place.job_id in requests)
    nodes_now = tuple(dataclasses.replace(node, cordoned=True) if node.name in nodes else node
                      for node in snapshot.nodes)
    alone = dataclasses.replace(snapshot, nodes=nodes_now, pending=(request,),
                                running=snapshot.running + placed_now,
                                promises=snapshot.promises)
    second = decide(alone, now=now, config=config)
    for place in second.placements:
        if place.job_id == job_id:
            gpus = {g for part in place.slices for g in part.gpu_ids}
            if not gpus & taken and not any(part.node in nodes for part in place.slices):
                return place
    for entry in second.pending:
        if entry.job_id == job_id:
            return entry
    return None
