"""The processes of a job this node runs: its leader (the job's process group) and its supervisor
(:mod:`agents.supervise`), what the runner knows of a running job, and the exit it reports. Every
signal to a job's group checks first that the leader is the same, not yet reaped process.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass

import psutil

from agents.protocol import LaunchJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinishedJob:
    """A job whose leader exited and whose process group has been killed."""

    job_id: int
    #: The leader's exit status, or ``-signum`` when a signal killed it; None when not known
    #: (an orphan nobody supervised, or one whose supervisor died).
    exit_code: int | None
    #: True when :meth:`agents.runner.JobRunner.stop` was asked to end it.
    stopped: bool
    output_tail: str
    finished_at: float
    #: True when :meth:`agents.runner.JobRunner.kill_out_of_memory` ended it; ``error`` says what happened.
    oom: bool = False
    error: str | None = None
    #: The node ended it for reasons of its own (agent restart or shutdown), not the job: run it again.
    requeue: bool = False
    #: Command id of the LaunchJob that started this run.
    launch_id: str | None = None
    #: The node ended it for running past the launch's ``max_runtime_s`` (SIGTERM, grace, SIGKILL).
    timed_out: bool = False
    #: The launch's GPUs and memory limit (the agent words an allocation failure with them).
    gpu_indices: tuple[int, ...] = ()
    gpu_memory_limit_mib: int | None = None


class Leader:
    """A job's process group leader, pinned by a pidfd: signals go to its group only while the
    leader is the same, not yet reaped process (a reaped leader's pid may name a stranger)."""

    def __init__(self, pid: int, pidfd: int | None, create_time: float | None):
        self.pid, self._pidfd, self._create_time = pid, pidfd, create_time

    @classmethod
    def attach(cls, pid: int, create_time: float | None) -> Leader | None:
        """The process ``pid`` if it started at ``create_time`` and is not reaped; else None."""
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pidfd = None
        leader = cls(pid, pidfd, create_time)
        try:
            same = create_time is not None and abs(psutil.Process(pid).create_time() - create_time) < 0.01
        except psutil.Error:
            same = False
        if not same or not leader.unreaped():
            leader.close()
            return None
        return leader

    def unreaped(self) -> bool:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, 0)
                return True
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        try:  # no pidfd (an old kernel): the start time tells a reused pid apart
            return abs(psutil.Process(self.pid).create_time() - (self._create_time or 0)) < 0.01
        except psutil.Error:
            return False

    def running(self) -> bool:
        """Alive and not a zombie."""
        if not self.unreaped():
            return False
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def signal_group(self, signum: int, job_id: int) -> None:
        if not self.unreaped():
            return  # its group is gone, or on its way: nothing of the job is left to signal
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass  # the whole group is already gone
        except PermissionError as exc:  # should not happen for our own jobs; never crash
            log.error("job %d: cannot signal process group %d: %s", job_id, self.pid, exc)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Supervisor:
    """A job's supervisor: this runner's child (``process``), or an earlier agent's (``adopted``)."""

    def __init__(self, process: subprocess.Popen | None = None, adopted: psutil.Process | None = None):
        self.process, self.adopted = process, adopted
        self.pid = process.pid if process is not None else adopted.pid

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None  # reaps it once it exits
        try:
            return self.adopted.is_running() and self.adopted.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


@dataclass
class RunningJob:
    job_id: int
    leader: Leader
    supervisor: Supervisor
    command: LaunchJob
    #: Monotonic time past which the supervisor ends the job (None: no limit); the runner stops
    #: throttling it then, so that it can act on the supervisor's SIGTERM.
    runtime_deadline: float | None = None
    kill_deadline: float | None = None  # monotonic; SIGKILL the group once it passes
    stopped: bool = False  # :meth:`agents.runner.JobRunner.stop` was asked to end it
    killed: bool = False
    oom_error: str | None = None  # set when killed for running out of GPU memory
    adopted: bool = False

    @property
    def pid(self) -> int:
        return self.leader.pid

    @property
    def ending(self) -> bool:
        """Told to end: SIGTERM sent, SIGKILL due at ``kill_deadline``."""
        return self.kill_deadline is not None

    @property
    def timing_out(self) -> bool:
        return self.runtime_deadline is not None and time.monotonic() >= self.runtime_deadline


def reap(process: subprocess.Popen, timeout: float = 5.0) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process has exited (a zombie has: its parent reaps it, not us); returns
    those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if is_running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_orphan(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # an agent not running as root, and a job of another account
        log.error("cannot signal process group %d: %s", pgid, exc)
