"""What each running job has had of its GPUs in this run, counted at the speed it ran: the service
that turnover among borrowers ranks by (``LiveReadings.served_gpu_s``, ``jobs.scheduling.turnover``).

Counted as the time a job has held its GPUs, a borrower slowed beside other borrowers or throttled
beside a guaranteed job passed one GPU-hour of "service" with most of its work still ahead, and
the next newcomer preempted it as the most served: in the replay of the Philly 2017-12-08
window, 289 jobs shorter than an hour were preempted so, some with under a minute of work left
(docs/scheduling-quality.md has what counting service at speed changed).

A job's speed is its live utilisation over its solo one (its profile's), at most 1; where either
is unknown, its duty cycle. Each cycle adds the time since the last one at the speed read now (a
reading is a mean over the last samples: it describes that time). A job first seen in a run (a
new run, or a process that has just taken the scheduler's lease over) counts the time before as
held time, as before, and so does a gap of more than ``MAX_GAP_S`` between two cycles this
process measured (another process led meanwhile): what another process measured is kept nowhere.

Per scheduler process, Django-free: the loop hands it each cycle's snapshot and decides on the
one it hands back.
"""

from __future__ import annotations

from dataclasses import replace

from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, RunningJob

# Past this long between two cycles, the time between counts as held: no reading spoke for it.
MAX_GAP_S = 300.0


def speed(job: RunningJob, live_utilisation: float | None) -> float:
    """The share of its solo speed ``job`` runs at, as measured: 0..1."""
    if job.duty_cycle <= 0:
        return 0.0
    solo = job.solo_utilisation
    if live_utilisation is None or not solo or solo <= 0:
        return min(1.0, job.duty_cycle)
    return max(0.0, min(1.0, live_utilisation / solo))


class ServiceMeter:
    def __init__(self) -> None:
        # job id -> (the run's start, GPU-seconds served in it, as of when)
        self._runs: dict[int, tuple[float, float, float]] = {}

    def measured(self, snapshot: ClusterSnapshot, now: float) -> ClusterSnapshot:
        """``snapshot`` with each running job's service in this run in its readings."""
        runs, kept, served = self._runs, {}, {}
        live = snapshot.readings.jobs
        for job in snapshot.running:
            gpus = job.quota_milli / WHOLE_GPU_MILLI
            seen = runs.get(job.id)
            if seen is None or seen[0] != job.started_at:  # (a run this process has not seen before)
                total = max(0.0, now - job.started_at) * gpus
            else:
                gap = max(0.0, now - seen[2])
                total = seen[1] + gap * gpus * (speed(job, live.get(job.id)) if gap <= MAX_GAP_S else 1.0)
            kept[job.id] = (job.started_at, total, now)
            served[job.id] = total
        self._runs = kept  # (jobs no longer running are forgotten)
        return replace(snapshot, readings=replace(snapshot.readings, served_gpu_s=served))
