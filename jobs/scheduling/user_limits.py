"""Per-user limits inside a tenant (a tenant lead's lever): a member at the most jobs running or
GPUs held that the lead allows waits, with the reason and when one of theirs should end.

Counted like arrays: this cycle's placements count at once, jobs already told to stop still run.
"""

from __future__ import annotations

from collections import defaultdict

from jobs.scheduling import reasons
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobRequest


class UserLimits:
    def __init__(self, snapshot: ClusterSnapshot, now: float):
        self.now = now
        self.limits = {(limit.tenant, limit.user): limit for limit in snapshot.user_limits
                       if limit.max_gpus is not None or limit.max_running is not None}
        self.running: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.milli: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.ends: defaultdict[tuple[str, str], list[float]] = defaultdict(list)
        self.blocked: defaultdict[tuple[str, str], int] = defaultdict(int)
        if self.limits:
            for job in snapshot.running:
                key = (job.tenant, job.user)
                if key in self.limits:
                    self.running[key] += 1
                    self.milli[key] += job.quota_milli
                    if not job.preempting and job.expected_end is not None:
                        self.ends[key].append(max(now, job.expected_end))

    def _over(self, job: JobRequest, more_jobs: int = 0, more_milli: int = 0) -> tuple[bool, bool]:
        """(over its running-jobs limit, over its GPU limit) for ``job``'s owner, as things stand
        plus ``more_jobs`` jobs holding ``more_milli`` more."""
        limit = self.limits.get((job.tenant, job.user)) if self.limits else None
        if limit is None:
            return False, False
        key = (job.tenant, job.user)
        return (limit.max_running is not None and self.running[key] + more_jobs >= limit.max_running,
                limit.max_gpus is not None
                and self.milli[key] + more_milli + job.quota_milli > limit.max_gpus * WHOLE_GPU_MILLI)

    def at_limit(self, job: JobRequest, more_jobs: int = 0, more_milli: int = 0) -> bool:
        """Whether ``job``'s owner would be at a limit with ``more_jobs`` more of theirs holding
        ``more_milli`` more; unlike :meth:`why_waiting`, counts no wait."""
        return any(self._over(job, more_jobs, more_milli))

    def why_waiting(self, job: JobRequest) -> tuple[PendingReason, float | None] | None:
        """The reason and ETA when ``job``'s owner is at a limit; None when it may start."""
        over_jobs, over_gpus = self._over(job)
        if not (over_jobs or over_gpus):
            return None
        limit = self.limits[(job.tenant, job.user)]
        key = (job.tenant, job.user)
        running, milli = self.running[key], self.milli[key]
        # The i-th waiting job of this member starts (at the earliest) once i + 1 of theirs ended.
        position = self.blocked[key]
        self.blocked[key] += 1
        ends = sorted(self.ends.get(key, ()))
        eta_at = ends[position] if position < len(ends) else None
        reason = reasons.user_limit(limit.name or job.user, job.tenant, running, limit.max_running,
                                    milli / WHOLE_GPU_MILLI, limit.max_gpus, job.quota_milli / WHOLE_GPU_MILLI,
                                    "jobs" if over_jobs else "gpus")
        return reason, eta_at

    def placed(self, job: JobRequest) -> None:
        key = (job.tenant, job.user)
        if key in self.limits:
            self.running[key] += 1
            self.milli[key] += job.quota_milli
            if job.expected_runtime_s is not None:
                self.ends[key].append(self.now + job.expected_runtime_s)
