"""Starts, stops and reaps job processes on this node. No Redis and no protocol I/O here.

Each job runs its argv without a shell as the leader of its own session and process group, so
that stopping a job reaches everything it spawned (data loader workers, ``torchrun`` children),
and nothing of a job outlives it. A process that calls ``setsid()`` itself escapes the group;
containing that needs cgroups, which is out of scope here.

Jobs are contained by what the agent decides, never by the job spec (``LaunchJob`` has no
working directory, shell or user to ask for):

- the process runs as the account :class:`agents.accounts.RunAsPolicy` picks (``Popen`` drops
  to its uid, gid and supplementary groups before exec), and an agent running as root refuses a
  job it has no unprivileged account for unless told otherwise;
- its environment is an allow-list of the agent's variables plus the spec's and Colony's own,
  never the agent's whole environment (which may hold the Redis password);
- its output goes through a pipe into a size-bounded log (:mod:`agents.joblog`).

Layout under ``workdir``: ``jobs/<job_id>/`` belongs to the agent (readable by the job's group)
and holds ``output.log``, the job's stdout and stderr; ``jobs/<job_id>/work/`` is the job's
working directory, owned by the job's account. The job cannot write to its log other than
through the pipe, nor swap it for a link to a file it should not read.

An agent that dies (SIGKILL, a crash) leaves its jobs' processes running with nobody to read their
output pipe. The runner keeps a ``process.json`` per running job (leader pid and its start time,
so a reused pid is never mistaken for it); the next agent on the node stops those orphans before
it registers (:meth:`JobRunner.stop_orphans`) and reports them for a requeue, so a job never runs
twice at once. (Re-adopting them is not possible: their output pipe died with the agent.)

Duty cycles and suspension are delegated to :class:`agents.throttle.DutyCycler` (its own thread);
the runner tells it to forget a job before reaping the job's leader, so no signal can outlive the
job's process group id.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from agents.accounts import (
    DEFAULT_PASS_ENV,
    Account,
    NoAccount,
    RunAsPolicy,
    identity_environment,
    job_environment,
)
from agents.backends.base import JobProcesses
from agents.joblog import DEFAULT_MAX_LOG_BYTES, BoundedLog
from agents.protocol import OUTPUT_TAIL_BYTES, LaunchJob
from agents.throttle import DEFAULT_PERIOD, DutyCycler

log = logging.getLogger(__name__)

# How long a finished job's output may take to drain from the pipe before the log is closed
# (only a process that escaped the job's group keeps the pipe open that long).
OUTPUT_DRAIN_SECONDS = 1.0
PROCESS_RECORD = "process.json"


class LaunchError(RuntimeError):
    """The job's process could not be started; the message says why, for the user."""


@dataclass(frozen=True)
class FinishedJob:
    """A job whose leader exited and whose process group has been killed."""

    job_id: int
    #: The leader's exit status, or ``-signum`` when a signal killed it; None when not known
    #: (an orphan of an earlier agent is not this process's child).
    exit_code: int | None
    #: True when :meth:`JobRunner.stop` was asked to end it.
    stopped: bool
    output_tail: str
    finished_at: float
    #: True when :meth:`JobRunner.kill_out_of_memory` ended it; ``error`` says what happened.
    oom: bool = False
    error: str | None = None
    #: The node ended it for reasons of its own (agent restart or shutdown), not the job: run it again.
    requeue: bool = False
    #: Command id of the LaunchJob that started this run.
    launch_id: str | None = None
    #: The node ended it for running past the launch's ``max_runtime_s`` (SIGTERM, grace, SIGKILL).
    timed_out: bool = False


@dataclass
class _RunningJob:
    job_id: int
    process: subprocess.Popen
    log_path: Path
    command: LaunchJob
    output: BoundedLog
    started: float = 0.0  # monotonic, when the process was started
    kill_deadline: float | None = None  # monotonic; SIGKILL the group once it passes
    stopped: bool = False  # :meth:`JobRunner.stop` was asked to end it
    timed_out: bool = False  # ended for running past ``command.max_runtime_s``
    killed: bool = False
    oom_error: str | None = None  # set when killed for running out of GPU memory

    @property
    def ending(self) -> bool:
        """Told to end (stopped or timed out): SIGTERM sent, SIGKILL due at ``kill_deadline``."""
        return self.kill_deadline is not None

    def runtime_deadline(self) -> float | None:
        """When the job has run for its ``max_runtime_s`` (monotonic), or None without a limit.
        Wall-clock time: a throttled or suspended job's time counts too."""
        limit = self.command.max_runtime_s
        return None if limit is None else self.started + limit


class JobRunner:
    """The job processes of one agent. Not thread-safe: one agent loop drives it."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        duty_period: float = DEFAULT_PERIOD,
        run_as: RunAsPolicy | None = None,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        pass_env: tuple[str, ...] = DEFAULT_PASS_ENV,
    ):
        """``run_as`` picks each job's account; the default one refuses every launch when the
        agent is root. ``max_log_bytes`` bounds each job's ``output.log``; ``pass_env`` names the
        agent's variables (``NCCL_*`` patterns allowed) that jobs inherit."""
        self.workdir = Path(workdir)
        self.run_as = run_as if run_as is not None else RunAsPolicy()
        self.max_log_bytes = max_log_bytes
        self.pass_env = tuple(pass_env)
        self._jobs: dict[int, _RunningJob] = {}
        self._cycler = DutyCycler(duty_period)

    def job_dir(self, job_id: int) -> Path:
        """The agent's directory for the job: ``output.log`` and the working directory."""
        return self.workdir / "jobs" / str(job_id)

    def work_dir(self, job_id: int) -> Path:
        """The job's working directory, owned by the account it runs as."""
        return self.job_dir(job_id) / "work"

    def launch(self, cmd: LaunchJob) -> int:
        """Start the job; return the leader's pid. Launching a running job returns its pid again."""
        running = self._jobs.get(cmd.job_id)
        if running is not None:
            return running.process.pid
        try:
            account = self.run_as.account_for(cmd.tenant)
        except NoAccount as exc:
            raise LaunchError(str(exc)) from None
        job_dir, work_dir = self.job_dir(cmd.job_id), self.work_dir(cmd.job_id)
        log_path = job_dir / "output.log"
        try:
            self._prepare_directories(job_dir, work_dir, account)
            # A relaunch (a new attempt after a requeue) starts a fresh log: the tail the user
            # reads must be this attempt's, not the last one's.
            output, write_fd = BoundedLog.open(
                log_path, self.max_log_bytes, group=account.gid if account else None,
                name=f"job-{cmd.job_id}-output",
            )
        except OSError as exc:
            raise LaunchError(f"cannot prepare job directory {job_dir}: {exc.strerror or exc}") from exc
        identity = {}
        if account is not None:
            identity = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
        try:
            process = subprocess.Popen(
                cmd.argv,
                cwd=work_dir,
                env=self._job_env(cmd, account, work_dir),
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session and process group: pgid == pid
                close_fds=True,
                **identity,
            )
        except (OSError, subprocess.SubprocessError) as exc:  # missing executable, bad interpreter ...
            output.finish(0)
            raise LaunchError(f"cannot start {cmd.argv[0]!r}: {getattr(exc, 'strerror', None) or exc}") from exc
        except ValueError as exc:  # e.g. a NUL byte in argv or env
            output.finish(0)
            raise LaunchError(f"cannot start {cmd.argv[0]!r}: {exc}") from exc
        finally:
            os.close(write_fd)  # the child holds its own copy; the pump sees EOF once it is gone
        output.start()
        self._jobs[cmd.job_id] = _RunningJob(cmd.job_id, process, log_path, cmd, output, started=time.monotonic())
        self._write_record(cmd.job_id, process.pid, cmd.command_id)
        log.info(
            "job %d started: pid %d, GPUs %s, as %s",
            cmd.job_id, process.pid, cmd.gpu_indices or "none", account.name if account else "the agent's user",
        )
        if cmd.duty_cycle < 1:
            self.set_duty_cycle(cmd.job_id, cmd.duty_cycle)
        return process.pid

    def _prepare_directories(self, job_dir: Path, work_dir: Path, account: Account | None) -> None:
        """Create the job's directories; when switching users, the job's account gets the working
        directory (and only that) and its group may read the log; other accounts get nothing."""
        jobs_root = job_dir.parent
        jobs_root.mkdir(parents=True, exist_ok=True)
        job_dir.mkdir(exist_ok=True)
        work_dir.mkdir(exist_ok=True)
        if account is None:
            return
        os.chmod(jobs_root, 0o711)  # accounts may pass through to their own job, not list others
        os.chown(job_dir, -1, account.gid, follow_symlinks=False)
        os.chmod(job_dir, 0o750)
        # Not recursive: a retried job finds its previous attempt's files as they were.
        os.chown(work_dir, account.uid, account.gid, follow_symlinks=False)
        os.chmod(work_dir, 0o700)

    def _job_env(self, cmd: LaunchJob, account: Account | None, work_dir: Path) -> dict[str, str]:
        env = job_environment(
            os.environ, cmd.env, identity_environment(account, str(work_dir)), pass_env=self.pass_env
        )
        # Set last so a job cannot pick GPUs it was not given. CUDA numbers devices fastest-first
        # unless told otherwise; PCI bus order is the order NVML (and so our indices) uses.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in cmd.gpu_indices)
        env["COLONY_JOB_ID"] = str(cmd.job_id)
        return env

    def stop(self, job_id: int, grace_seconds: float) -> None:
        """SIGTERM the job's process group; :meth:`poll` sends SIGKILL once the grace is over.

        Unknown or already-finished jobs are ignored. A second stop never extends the deadline.
        """
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.stopped = True
        log.info("job %d: stopping (grace %.1fs)", job_id, grace_seconds)
        self._terminate(job, grace_seconds)

    def _terminate(self, job: _RunningJob, grace_seconds: float) -> None:
        """SIGTERM the group now and SIGKILL it ``grace_seconds`` later (:meth:`poll`); a second
        call never extends the deadline."""
        deadline = time.monotonic() + max(0.0, grace_seconds)
        if job.kill_deadline is not None and job.kill_deadline <= deadline:
            return
        job.kill_deadline = deadline
        # No more slicing; a stopped (throttled or suspended) group only acts on SIGTERM once it
        # is continued, so SIGCONT follows. SIGKILL needs no help.
        self._cycler.forget(job.job_id)
        self._signal_group(job, signal.SIGKILL if grace_seconds <= 0 else signal.SIGTERM)
        self._signal_group(job, signal.SIGCONT)

    def kill_out_of_memory(self, job_id: int, error: str) -> None:
        """SIGKILL the job's group because its GPU ran out of memory; :meth:`poll` reports it
        with ``oom=True`` and ``error``. Unknown or already-killed jobs are ignored."""
        job = self._jobs.get(job_id)
        if job is None or job.killed:
            return
        log.warning("job %d: out of GPU memory; killing it: %s", job_id, error)
        job.oom_error = error
        self._cycler.forget(job_id)
        self._signal_group(job, signal.SIGKILL)

    # ------------------------------------------------------------------ throttling

    def set_duty_cycle(self, job_id: int, duty_cycle: float) -> bool:
        """Time-slice the job to ``duty_cycle`` of each period (1.0: unthrottled); False if unknown."""
        job = self._live(job_id)
        if job is None:
            return False
        self._cycler.set_duty_cycle(job_id, job.process.pid, duty_cycle)
        log.info("job %d: duty cycle %.2f", job_id, duty_cycle)
        return True

    def suspend(self, job_id: int) -> bool:
        """Stop the job's process group until :meth:`resume`; False if unknown."""
        job = self._live(job_id)
        if job is None:
            return False
        self._cycler.suspend(job_id, job.process.pid)
        log.info("job %d: suspended", job_id)
        return True

    def resume(self, job_id: int) -> bool:
        """Continue a suspended job under its previous duty cycle; False if unknown."""
        if self._live(job_id) is None:
            return False
        self._cycler.resume(job_id)
        log.info("job %d: resumed (duty cycle %.2f)", job_id, self._cycler.duty_cycle(job_id))
        return True

    def duty_cycle(self, job_id: int) -> float:
        """The job's current share of wall time: 0.0 while suspended, 1.0 when unthrottled."""
        return 0.0 if self._cycler.suspended(job_id) else self._cycler.duty_cycle(job_id)

    def _live(self, job_id: int) -> _RunningJob | None:
        """A job that is running and not being stopped or killed (so it may be throttled)."""
        job = self._jobs.get(job_id)
        if job is None or job.ending or job.killed:
            return None
        return job

    def running(self) -> set[int]:
        """Ids of jobs whose exit has not yet been returned by :meth:`poll`."""
        return set(self._jobs)

    def processes(self) -> dict[int, JobProcesses]:
        """What a GPU backend needs to know about each running job, in launch order."""
        return {
            job.job_id: JobProcesses(
                job_id=job.job_id,
                pid=job.process.pid,
                gpu_indices=tuple(job.command.gpu_indices),
                env=dict(job.command.env),
                gpu_memory_limit_mib=job.command.gpu_memory_limit_mib,
                duty_cycle=self.duty_cycle(job.job_id),
            )
            for job in self._jobs.values()
        }

    def poll(self) -> list[FinishedJob]:
        """End jobs past their runtime limit, escalate overdue stops, and return the jobs that
        finished since the last call."""
        now = time.monotonic()
        finished = []
        for job in list(self._jobs.values()):
            runtime_deadline = job.runtime_deadline()
            if runtime_deadline is not None and now >= runtime_deadline and not job.timed_out and not job.killed:
                job.timed_out = True
                log.warning("job %d: ran past its limit of %ds; ending it (grace %.1fs)",
                            job.job_id, job.command.max_runtime_s, job.command.stop_grace_s)
                self._terminate(job, job.command.stop_grace_s)
            if job.kill_deadline is not None and now >= job.kill_deadline and not job.killed:
                log.warning("job %d: still running after its grace period; killing it", job.job_id)
                self._signal_group(job, signal.SIGKILL)
            if not _has_exited(job.process):
                continue
            # The leader is a zombie until we reap it, so its pid (== the group id) cannot be
            # reused yet: killing the group now reaches only this job's stragglers (stopped ones
            # too: SIGKILL needs no SIGCONT). The duty cycler lets go first, for the same reason.
            self._cycler.forget(job.job_id)
            self._signal_group(job, signal.SIGKILL)
            exit_code = job.process.wait()
            job.output.finish(OUTPUT_DRAIN_SECONDS)
            del self._jobs[job.job_id]
            self._record_path(job.job_id).unlink(missing_ok=True)
            finished.append(
                FinishedJob(
                    job_id=job.job_id,
                    exit_code=exit_code,
                    stopped=job.stopped,
                    output_tail=read_tail(job.log_path),
                    finished_at=time.time(),
                    oom=job.oom_error is not None,
                    error=job.oom_error,
                    launch_id=job.command.command_id,
                    timed_out=job.timed_out,
                )
            )
            log.info(
                "job %d exited with %d%s",
                job.job_id,
                exit_code,
                " (stopped)" if job.stopped else " (out of memory)" if job.oom_error
                else " (timed out)" if job.timed_out else "",
            )
        return finished

    def stop_all(self, grace_seconds: float, give_up_after: float = 10.0) -> list[FinishedJob]:
        """Stop every job and wait until all have exited (SIGKILL after the grace).

        Returns their exits. Gives up ``give_up_after`` seconds past the grace on processes that
        even SIGKILL does not end (uninterruptible I/O), leaving them listed as running.
        """
        for job_id in list(self._jobs):
            self.stop(job_id, grace_seconds)
        finished = self.poll()
        deadline = time.monotonic() + grace_seconds + give_up_after
        while self._jobs and time.monotonic() < deadline:
            time.sleep(0.02)
            finished.extend(self.poll())
        if self._jobs:
            log.error("jobs %s did not exit after SIGKILL", sorted(self._jobs))
        return finished

    # ------------------------------------------------------------------ orphans of an earlier agent

    def _record_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / PROCESS_RECORD

    def _write_record(self, job_id: int, pid: int, launch_id: str) -> None:
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return  # already gone: nothing could be orphaned
        path = self._record_path(job_id)
        tmp = path.with_name(PROCESS_RECORD + ".tmp")
        try:
            tmp.write_text(json.dumps({"pid": pid, "create_time": started, "launch_id": launch_id}))
            tmp.replace(path)
        except OSError as exc:  # a full disk costs orphan detection, never the job
            log.warning("job %d: cannot write %s: %s", job_id, path, exc)

    def stop_orphans(self, grace_seconds: float) -> list[FinishedJob]:
        """Stop job processes an earlier agent on this workdir started and never reaped.

        Each is continued (a duty cycle may have left it stopped), sent SIGTERM, and its group
        SIGKILLed after ``grace_seconds``. Returns them as finished jobs to requeue; records of
        processes that are gone, or whose pid now names another process, are just removed.
        """
        orphans: list[tuple[int, psutil.Process, str | None]] = []
        for path in sorted((self.workdir / "jobs").glob(f"*/{PROCESS_RECORD}")):
            job_id = int(path.parent.name) if path.parent.name.isdigit() else None
            try:
                record = json.loads(path.read_text())
                process = psutil.Process(int(record["pid"]))
                same = abs(process.create_time() - float(record["create_time"])) < 0.01 and _running(process)
            except (OSError, ValueError, KeyError, TypeError, psutil.Error):
                same = False
            if job_id is None or job_id in self._jobs or not same:
                path.unlink(missing_ok=True)
                continue
            log.warning("job %d: process %d outlived an earlier agent; stopping it", job_id, process.pid)
            for signum in (signal.SIGCONT, signal.SIGTERM):
                _signal_orphan(process.pid, signum)
            orphans.append((job_id, process, record.get("launch_id")))
        survivors: list[psutil.Process] = []
        if orphans:
            alive = _wait_gone([process for _, process, _ in orphans], grace_seconds)
            for process in alive:
                log.warning("process %d: still running after %.0fs; killing its group", process.pid, grace_seconds)
            for _, process, _ in orphans:
                _signal_orphan(process.pid, signal.SIGKILL)  # the group's stragglers, or the leader itself
            survivors = _wait_gone(alive, 5.0)
        finished = []
        for job_id, process, launch_id in orphans:
            if process in survivors:
                # Not reported: a requeue now would run the job beside it. The record stays, so the
                # next agent start tries again; the control plane requeues it after it vanishes.
                log.error("job %d: process %d survived SIGKILL (or may not be signalled); not requeued",
                          job_id, process.pid)
                continue
            self._record_path(job_id).unlink(missing_ok=True)
            finished.append(FinishedJob(
                job_id=job_id, exit_code=None, stopped=True, requeue=True, finished_at=time.time(), launch_id=launch_id,
                output_tail=read_tail(self.job_dir(job_id) / "output.log"),
                error="the node's agent restarted while the job ran; its process was stopped",
            ))
        return finished

    def close(self) -> None:
        """End the duty-cycle thread, continuing anything it holds stopped. Idempotent."""
        self._cycler.close()

    def _signal_group(self, job: _RunningJob, signum: int) -> None:
        if signum == signal.SIGKILL:
            job.killed = True
        try:
            os.killpg(job.process.pid, signum)
        except ProcessLookupError:
            pass  # the whole group is already gone
        except PermissionError as exc:  # should not happen for our own children; never crash
            log.error("job %d: cannot signal process group %d: %s", job.job_id, job.process.pid, exc)


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process has exited (a zombie has: its parent reaps it, not us); returns
    those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_orphan(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # an agent not running as root, and a job of another account
        log.error("cannot signal process group %d: %s", pgid, exc)


def _has_exited(process: subprocess.Popen) -> bool:
    """Whether the leader has exited, without reaping it (see :meth:`JobRunner.poll`)."""
    if process.returncode is not None:
        return True
    try:
        status = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # reaped elsewhere; Popen.wait() copes
    return status is not None


def read_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text (invalid UTF-8 replaced); "" if unreadable."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - limit))
            data = file.read(limit)
    except OSError:
        return ""
    if len(data) == limit:
        # The cut may land inside a multi-byte character: drop its continuation bytes rather
        # than start the tail with a replacement character.
        skip = 0
        while skip < 3 and skip < len(data) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", errors="replace")
