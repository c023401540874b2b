"""What every change of a job's state is fenced on: the states its run is live in, its current
attempt, the nodes that hold its GPUs."""

from __future__ import annotations

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.commands import launch_id

# States in which the job's processes should be running (or starting) on its nodes.
LIVE = (JobState.PLACED, JobState.RUNNING)
STOPPING = (JobState.CANCELLING, JobState.PREEMPTING)


def current_launch_id(job_id: int) -> str | None:
    attempt = Job.objects.filter(pk=job_id).values_list("attempt", flat=True).first()
    return None if attempt is None else launch_id(job_id, attempt)


def live_nodes(job_id: int) -> set[str]:
    return set(Allocation.objects.filter(job_id=job_id, released_at__isnull=True)
               .values_list("gpu__node__name", flat=True))
