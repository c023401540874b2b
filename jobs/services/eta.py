"""What a pending job's ETA reads as now: seconds until it could start, from what the scheduling
loop stored on the job. Shared by the API (job and queue entries) and the pages."""

from __future__ import annotations

import time

from jobs.choices import JobState
from jobs.models import Job


def eta_seconds(job: Job, now: float | None = None) -> float | None:
    """The scheduler's estimate of seconds until the job can start, when it has one. The cycle
    stores it as an absolute time (``eta_at``, so an estimate that holds does not rewrite the row
    every cycle); what is left of it is counted from now, never below zero."""
    if job.state != JobState.PENDING:
        return None
    eta_at = (job.pending_reason or {}).get("eta_at")
    if not isinstance(eta_at, (int, float)) or isinstance(eta_at, bool):
        return None
    return float(max(0, round(float(eta_at) - (time.time() if now is None else now))))
