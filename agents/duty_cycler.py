"""Throttling and suspension of jobs from outside the framework (AntMan's computation scaling).

A job with duty cycle ``d`` < 1 is time-sliced with SIGSTOP/SIGCONT of its process group: in every
period (1 s by default) it runs for ``d * period`` and is stopped for the rest. A suspended job is
stopped until it is resumed, then continues under the duty cycle it had (or was given meanwhile).

Why a thread: the agent loop blocks in XREADGROUP for up to an interval and in Redis calls for
seconds when the server is slow, so slices of a few hundred milliseconds cannot hang off it. This
thread sleeps until the next start or stop edge and does nothing else; it only ever sends signals.
Every signal is sent under the lock, and :meth:`DutyCycler.forget` takes the lock too, so once
``forget`` returns the thread will never signal that process group again. The job's supervisor
(:mod:`agents.supervise`), not the agent, reaps the job's leader, so the runner hands the cycler a
``signal_group`` that first checks (through a pidfd) that the leader is not yet reaped: until then
it is at worst a zombie, which keeps its pid (the group id) from being reused, so a signal can
never reach a stranger's processes.

All slices start at the same period boundary: the throttled jobs of a node run together and
leave the GPU to the unthrottled ones together, which is what a guaranteed neighbour needs.

What must not live here: process starting/reaping (:mod:`agents.runner`), Redis, the protocol.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 1.0
#: Slices shorter than this are not worth two signals; the job simply runs (or stays stopped).
MIN_SLICE = 0.005


@dataclass
class _Sliced:
    pgid: int
    duty_cycle: float = 1.0
    suspended: bool = False
    stopped: bool = False  # whether we last sent SIGSTOP
    stop_at: float | None = None  # monotonic; when to stop it in the current period


class DutyCycler:
    """Applies duty cycles and suspensions to process groups. Thread-safe."""

    def __init__(self, period: float = DEFAULT_PERIOD, signal_group=None):
        """``signal_group(job_id, pgid, signum)`` sends each signal (called with the lock held);
        the runner's checks that the group's leader is still the job's before signalling it."""
        if not period > 0:
            raise ValueError("period must be positive")
        self.period = period
        self._signal_group = signal_group or _signal_group
        self._jobs: dict[int, _Sliced] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._period_start = 0.0

    # ------------------------------------------------------------------ commands

    def set_duty_cycle(self, job_id: int, pgid: int, duty_cycle: float) -> None:
        """Run the job ``duty_cycle`` (0 < d <= 1) of each period; 1 means never stop it."""
        if not 0 < duty_cycle <= 1:
            raise ValueError(f"duty cycle must be in (0, 1], got {duty_cycle}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                if duty_cycle >= 1:
                    return
                job = self._jobs[job_id] = _Sliced(pgid)
            job.duty_cycle = duty_cycle
            if not job.suspended:
                if duty_cycle >= 1:
                    self._continue(job_id, job)
                    del self._jobs[job_id]
                elif not job.stopped:
                    # Running in this period: cut it at its new share (at once if that is past).
                    job.stop_at = self._stop_time(job)
            self._start_thread()
            self._wake.notify()

    def suspend(self, job_id: int, pgid: int) -> None:
        """Stop the job's group until :meth:`resume`; its duty cycle is kept for then."""
        with self._lock:
            job = self._jobs.setdefault(job_id, _Sliced(pgid))
            job.suspended = True
            job.stop_at = None
            self._stop(job_id, job)
            self._wake.notify()

    def resume(self, job_id: int) -> None:
        """Continue a suspended job under its duty cycle. Not suspended: nothing to do."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or not job.suspended:
                return
            job.suspended = False
            self._continue(job_id, job)
            if job.duty_cycle >= 1:
                del self._jobs[job_id]
            else:
                job.stop_at = self._stop_time(job)
                self._start_thread()
            self._wake.notify()

    def forget(self, job_id: int) -> bool:
        """Stop managing the job, leaving its group as it is; True if it may be stopped now.

        After this returns the thread sends the group nothing more (see the module docstring).
        """
        with self._lock:
            job = self._jobs.pop(job_id, None)
            self._wake.notify()
            return job is not None and job.stopped

    def duty_cycle(self, job_id: int) -> float:
        """The job's duty cycle (1.0 when unthrottled), also while suspended."""
        with self._lock:
            job = self._jobs.get(job_id)
            return 1.0 if job is None else job.duty_cycle

    def suspended(self, job_id: int) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            return job is not None and job.suspended

    def close(self) -> None:
        """Continue every group we hold stopped and end the thread. Idempotent."""
        with self._lock:
            self._closed = True
            for job_id, job in list(self._jobs.items()):
                self._continue(job_id, job)
            self._jobs.clear()
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    # ------------------------------------------------------------------ the slicing thread

    def _start_thread(self) -> None:
        if self._thread is None and not self._closed:
            self._period_start = time.monotonic()
            self._thread = threading.Thread(target=self._serve, name="duty-cycler", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        with self._lock:
            next_period = time.monotonic()
            while not self._closed:
                now = time.monotonic()
                if now >= next_period:
                    # Keep the period grid unless we fell a whole period behind (a stall).
                    self._period_start = next_period if now - next_period < self.period else now
                    next_period = self._period_start + self.period
                    for job_id, job in self._jobs.items():
                        if job.suspended:
                            continue
                        if job.duty_cycle * self.period < MIN_SLICE:
                            self._stop(job_id, job)  # a slice too short to be worth running
                        else:
                            self._continue(job_id, job)
                            job.stop_at = self._stop_time(job)
                for job_id, job in self._jobs.items():
                    if job.stop_at is not None and now >= job.stop_at:
                        job.stop_at = None
                        self._stop(job_id, job)
                edges = [job.stop_at for job in self._jobs.values() if job.stop_at is not None]
                if not self._jobs:
                    self._wake.wait()  # idle until a job is throttled again
                    next_period = time.monotonic()
                    continue
                self._wake.wait(max(0.0, min([next_period, *edges]) - time.monotonic()))

    def _stop_time(self, job: _Sliced) -> float | None:
        """When the job stops in the current period; None if its off-slice is too short to bother."""
        if self.period * (1 - job.duty_cycle) < MIN_SLICE:
            return None
        return self._period_start + job.duty_cycle * self.period

    # ------------------------------------------------------------------ signals (lock held)

    def _stop(self, job_id: int, job: _Sliced) -> None:
        if not job.stopped:
            job.stopped = True
            self._signal_group(job_id, job.pgid, signal.SIGSTOP)

    def _continue(self, job_id: int, job: _Sliced) -> None:
        if job.stopped:
            job.stopped = False
            self._signal_group(job_id, job.pgid, signal.SIGCONT)


def _signal_group(job_id: int, pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass  # the group is gone; the runner will reap and forget it
    except PermissionError as exc:
        log.error("job %d: cannot signal process group %d: %s", job_id, pgid, exc)
