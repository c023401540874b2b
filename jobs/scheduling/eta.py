"""Estimated start times for pending jobs, from the expected ends of running jobs.

A job's ETA is when enough GPUs will have been released for it and for every capacity-blocked job
ahead of it in this cycle's order (queue-aware, like Slurm's expected start). Running jobs without
an expected runtime release at an unknown time: they are left out, so the estimate is None once
the known releases do not cover the demand. A job past its expected end counts as ending now.
Topology is ignored (a gang may need its GPUs on one node): this is a guide, not a promise.

An ETA is a time on the cycle's clock, not seconds from it: while the running jobs and the queue
stay, each job's ETA stays the same number from one cycle to the next. A release already overdue
keeps its expected end (in the past: any moment), so that holds for those too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter

from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, RunningJob


def releases_of(running: Sequence[RunningJob]) -> list[tuple[float, int, str, int]]:
    """(when, milli-GPUs released, tenant, job id) for each of ``running`` with an expected end,
    in time order: what ``ReleaseTimeline`` is made of, for the whole cluster or one tenant."""
    return sorted((end, job.quota_milli, job.tenant, job.id)
                  for job in running if (end := job.expected_end) is not None)


class ReleaseTimeline:
    def __init__(self, running: list[RunningJob], now: float, releases: list[tuple] | None = None):
        """``releases``: ``releases_of(running)`` (or some of it), made already."""
        self.now = now
        if releases is None:
            releases = sorted((end, job.quota_milli) for job in running if (end := job.expected_end) is not None)
        self.times = list(map(_when, releases))
        self.released_milli = list(accumulate(map(_milli, releases)))

    def eta(self, needed_milli: int) -> float | None:
        """When ``needed_milli`` milli-GPUs will have been released (now, or earlier: any moment)."""
        if needed_milli <= 0:
            return self.now
        position = bisect_left(self.released_milli, needed_milli)
        if position == len(self.released_milli):
            return None
        return self.times[position]


_when, _milli = itemgetter(0), itemgetter(1)


class QueueEta:
    """ETA for capacity-blocked jobs in processing order: each one adds its demand to the queue."""

    def __init__(self, timeline: ReleaseTimeline, free_milli: int):
        self.timeline = timeline
        self.free_milli = free_milli
        self.ahead_milli = 0
        self.exhausted = False  # demand ahead already exceeds every known release

    def next(self, job_milli: int) -> float | None:
        if self.exhausted:
            return None
        needed = max(self.ahead_milli + job_milli - self.free_milli, WHOLE_GPU_MILLI if job_milli else 0)
        self.ahead_milli += job_milli
        eta = self.timeline.eta(needed)
        if eta is None:
            self.exhausted = True
        return eta
