"""What each running job has had of its GPUs in this run, counted at the speed it ran: the service
that turnover among borrowers ranks by (``LiveReadings.served_gpu_s``, ``jobs.scheduling.turnover``).

Counted as the time a job has held its GPUs, a borrower slowed beside other borrowers or throttled
beside a guaranteed job passed one GPU-hour of "service" with most of its work still ahead, and
the next newcomer preempted it as the most served: in the replay of the Philly 2017-12-08
window, 289 jobs shorter than an hour were preempted so, some with under a minute of work left
(docs/scheduling-quality.md has what counting service at speed changed).

A job's speed is its live utilisation over its solo one (its profile's), at most 1; where either
is unknown, its duty cycle; alone on its GPUs and not throttled, 1 (nothing slows it but itself).
Every ``MEASURE_EVERY_S`` the time since the last measure is added at the speed read now (a
reading is a mean over the last samples: it describes that time); in between, a job runs on at the
speed read last. Only borrowers that checkpoint are measured: turnover asks for no one else's
service. A run first seen (a new run, or a process that has just taken the scheduler's lease over)
counts the time before as held time, as before, and so does a gap of more than ``MAX_GAP_S``
between two measures (another process led meanwhile): what another process measured is kept
nowhere.

Per scheduler process, Django-free: the loop hands it each cycle's snapshot and decides on the
one it hands back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobClass, RunningJob

OPPORTUNISTIC = JobClass.OPPORTUNISTIC

# Past this long between two measures, the time between counts as held: no reading spoke for it.
MAX_GAP_S = 300.0
# How often the readings are read into each borrower's service (between two, it runs on at the
# speed read last).
MEASURE_EVERY_S = 30.0


def speed(job: RunningJob, live_utilisation: float | None, shares: bool = True) -> float:
    """The share of its solo speed ``job`` runs at, as measured: 0..1. ``shares``: whether another
    job is on one of its GPUs. Alone and not throttled, nothing the scheduler did slows it: a job
    that runs below its profile there (idle, or a profile recorded hot on purpose) has had the
    time it held, or a borrower could keep its GPU from turnover by running slow."""
    if job.duty_cycle <= 0:
        return 0.0
    if not shares and job.duty_cycle >= 1:
        return 1.0
    solo = job.solo_utilisation
    if live_utilisation is None or not solo or solo <= 0:
        return min(1.0, job.duty_cycle)
    return max(0.0, min(1.0, live_utilisation / solo))


class Served(Mapping):
    """Each measured borrower's service in this run at ``now``: what it had when last measured,
    and the time since at the speed read then. Computed when asked: turnover asks for a few
    GPUs' residents, not for every running job."""

    __slots__ = ("_runs", "_now")

    def __init__(self, runs: dict[int, tuple[float, float, float, float, float]], now: float):
        self._runs, self._now = runs, now

    def __getitem__(self, job_id: int) -> float:
        _, total, at, gpus, rate = self._runs[job_id]
        return total + max(0.0, self._now - at) * gpus * rate

    def __iter__(self):
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)


class ServiceMeter:
    def __init__(self) -> None:
        # job id -> (the run's start, GPU-seconds served in it, as of when, GPUs, speed read then)
        self._runs: dict[int, tuple[float, float, float, float, float]] = {}
        self._measured_at: float | None = None

    def measured(self, snapshot: ClusterSnapshot, now: float) -> ClusterSnapshot:
        """``snapshot`` with the service in this run of each running borrower that checkpoints in
        its readings (turnover's only candidates: it asks for no one else's). The readings are
        read every ``MEASURE_EVERY_S``, not every cycle: the loop's cycles come every 2 s, over
        thousands of running jobs, and an hour's threshold needs no finer steps."""
        if self._measured_at is None or not 0 <= now - self._measured_at < MEASURE_EVERY_S:
            self._measure(snapshot, now)
        return replace(snapshot, readings=replace(snapshot.readings, served_gpu_s=Served(self._runs, now)))

    def _measure(self, snapshot: ClusterSnapshot, now: float) -> None:
        runs, kept = self._runs, {}
        live, max_gap = snapshot.readings.jobs.get, MAX_GAP_S
        residents: dict[int, int] = {}
        for job in snapshot.running:
            for gpu_id in job.gpu_ids:
                residents[gpu_id] = residents.get(gpu_id, 0) + 1
        for job in snapshot.running:
            if not job.checkpoints or job.job_class is not OPPORTUNISTIC:
                continue
            job_id, started_at = job.id, job.started_at
            gpus = job.quota_milli / WHOLE_GPU_MILLI
            rate = speed(job, live(job_id), any(residents[gpu_id] > 1 for gpu_id in job.gpu_ids))
            seen = runs.get(job_id)
            if seen is None or seen[0] != started_at:  # (a run this process has not seen before)
                total = max(0.0, now - started_at) * gpus
            else:
                gap = now - seen[2]
                # (the time since the last reading, at the speed read now: a reading is a mean over
                # the last samples; past the longest gap no reading spoke for it, and it counts whole)
                total = seen[1] + max(0.0, gap) * gpus * (rate if gap <= max_gap else 1.0)
            kept[job_id] = (started_at, total, now, gpus, rate)
        self._runs, self._measured_at = kept, now  # (jobs no longer running are forgotten)
