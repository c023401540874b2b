"""Jobs an earlier agent on this workdir left: taken over while their supervisor runs, reported
from their supervisor's record when they ended meanwhile, stopped (and reported for a requeue)
when nobody supervises them any more, so that a job never runs twice at once. The runner calls
these from :meth:`agents.runner.JobRunner.recover` and ``adopt_late``; they hold no state.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import psutil

from agents import supervise
from agents.job_output import read_tail
from agents.job_processes import (
    FinishedJob,
    Leader,
    RunningJob,
    Supervisor,
    is_running,
    signal_orphan,
    wait_gone,
)
from agents.job_records import EXIT_RECORD, PROCESS_RECORD, STOP_RECORD, read_launch, spawn_ended

log = logging.getLogger(__name__)


def take_over(job_id: int, record_path: Path) -> tuple[RunningJob, dict | None] | None:
    """The job whose supervisor wrote ``record_path`` (its ``process.json``), as the runner is to
    hold it: with the exit its supervisor recorded when it ended, else (None) running, with the
    stop an earlier agent had begun carried through and continued (a duty cycle may have left it
    stopped). None when nobody supervises it any more: :func:`stop_unsupervised` ends it."""
    job_dir = record_path.parent
    record = supervise.read_json(record_path)
    command = read_launch(job_dir)
    if record is None or "supervisor_pid" not in record or command is None:
        return None  # a record from before supervisors: stop_unsupervised handles it
    result = supervise.read_json(job_dir / EXIT_RECORD)
    supervisor = adopted_supervisor(record)
    if result is None and supervisor is None:
        result = supervise.read_json(job_dir / EXIT_RECORD)
        if result is None:
            return None  # nobody supervises it: stop_unsupervised
    leader = Leader.attach(int(record["pid"]), record.get("create_time")) if result is None else None
    job = RunningJob(job_id, leader or Leader(int(record["pid"]), None, -1.0),
                     Supervisor(adopted=supervisor) if supervisor else None, command, adopted=True)
    if result is not None:
        return job, result
    started_at, limit = record.get("started_at"), record.get("max_runtime_s")
    if isinstance(started_at, (int, float)) and isinstance(limit, (int, float)):
        job.runtime_deadline = time.monotonic() + (started_at + limit - time.time())
    stop = supervise.read_json(job_dir / STOP_RECORD) or {}
    if stop.get("reason") == "oom":
        job.oom_error, job.killed = str(stop.get("error") or "out of GPU memory"), True
        job.leader.signal_group(signal.SIGKILL, job_id)
    elif stop.get("reason") in ("stop", "shutdown"):
        # The earlier agent was stopping it: carry the stop through, SIGKILL when it was due.
        job.stopped = True
        kill_at = stop.get("kill_at") if isinstance(stop.get("kill_at"), (int, float)) else time.time()
        job.kill_deadline = time.monotonic() + max(0.0, kill_at - time.time())
    # A duty cycle may have left it stopped. It runs at its launch's duty cycle until the
    # control plane says otherwise (it tells a registering agent the duty cycle of each job
    # the agent lists as running; a job adopted late was not listed, and its launch's duty
    # cycle may never have been set: the earlier agent died before it could).
    job.leader.signal_group(signal.SIGCONT, job_id)
    return job, None


def stop_unsupervised(jobs_root: Path, known: set[int], grace_seconds: float) -> list[FinishedJob]:
    """Stop job processes an earlier agent on this workdir left that nobody supervises any
    more (their supervisor died, or the record predates supervisors).

    Each is continued (a duty cycle may have left it stopped), sent SIGTERM, and its group
    SIGKILLed after ``grace_seconds``. Returns them as finished jobs to requeue; records of
    processes that are gone, or whose pid now names another process, are just removed (a
    supervised job's is reported for a requeue: its fate is unknown). Jobs this runner runs or
    adopted (:meth:`agents.runner.JobRunner.recover`), ``known``, are left alone.
    """
    orphans: list[tuple[int, psutil.Process, str | None]] = []
    vanished: list[tuple[int, str | None]] = []
    for path in sorted(jobs_root.glob(f"*/{PROCESS_RECORD}")):
        job_id = int(path.parent.name) if path.parent.name.isdigit() else None
        if job_id in known:
            continue
        record = supervise.read_json(path) or {}
        if "supervisor_pid" in record and read_launch(jobs_root / str(job_id)) is not None and (
            adopted_supervisor(record) is not None or (path.parent / EXIT_RECORD).exists()
        ):
            continue  # supervised, or ended with its exit recorded: for recover(), never stopped here
        try:
            process = psutil.Process(int(record["pid"]))
            same = abs(process.create_time() - float(record["create_time"])) < 0.01 and is_running(process)
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            same = False
        if job_id is None or not same:
            if job_id is not None and "supervisor_pid" in record:
                vanished.append((job_id, record.get("launch_id")))
            if spawn_ended(path.parent):  # (it ran: never taken for a spawn that did not happen)
                path.unlink(missing_ok=True)
            continue
        log.warning("job %d: process %d outlived its agent and supervisor; stopping it", job_id, process.pid)
        for signum in (signal.SIGCONT, signal.SIGTERM):
            signal_orphan(process.pid, signum)
        orphans.append((job_id, process, record.get("launch_id")))
    survivors: list[psutil.Process] = []
    if orphans:
        alive = wait_gone([process for _, process, _ in orphans], grace_seconds)
        for process in alive:
            log.warning("process %d: still running after %.0fs; killing its group", process.pid, grace_seconds)
        for _, process, _ in orphans:
            signal_orphan(process.pid, signal.SIGKILL)  # the group's stragglers, or the leader itself
        survivors = wait_gone(alive, 5.0)
    finished = []
    for job_id, launch_id in vanished:
        job_dir = jobs_root / str(job_id)
        (job_dir / STOP_RECORD).unlink(missing_ok=True)
        finished.append(FinishedJob(
            job_id=job_id, exit_code=None, stopped=True, requeue=True, finished_at=time.time(), launch_id=launch_id,
            output_tail=read_tail(job_dir / "output.log"),
            error="the job's supervisor died while no agent ran; how the job ended is not known",
        ))
    for job_id, process, launch_id in orphans:
        if process in survivors:
            # Not reported: a requeue now would run the job beside it. The record stays, so the
            # next agent start tries again; the control plane requeues it after it vanishes.
            log.error("job %d: process %d survived SIGKILL (or may not be signalled); not requeued",
                      job_id, process.pid)
            continue
        job_dir = jobs_root / str(job_id)
        if spawn_ended(job_dir):
            (job_dir / PROCESS_RECORD).unlink(missing_ok=True)
        (job_dir / STOP_RECORD).unlink(missing_ok=True)
        finished.append(FinishedJob(
            job_id=job_id, exit_code=None, stopped=True, requeue=True, finished_at=time.time(), launch_id=launch_id,
            output_tail=read_tail(job_dir / "output.log"),
            error="the node's agent restarted while the job ran; its process was stopped",
        ))
    return finished


def adopted_supervisor(record: dict) -> psutil.Process | None:
    """The supervisor a record names, if it still runs (same pid and start time)."""
    try:
        process = psutil.Process(int(record["supervisor_pid"]))
        if abs(process.create_time() - float(record["supervisor_create_time"])) < 0.01 and is_running(process):
            return process
    except (ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None
