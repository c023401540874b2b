"""The files in a job's directory through which the agent, the job's supervisor and a later agent
tell each other how an attempt stands (the layout is described in :mod:`agents.runner`): their
names, and the writes and reads whose order matters when an agent may die between any two steps.
No processes are started or signalled here.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from agents import supervise
from agents.protocol import LaunchJob

log = logging.getLogger(__name__)

# How long the runner waits for a new supervisor to say the job started (or could not).
SUPERVISOR_START_SECONDS = 30.0
PROCESS_RECORD = supervise.PROCESS_RECORD
EXIT_RECORD = supervise.EXIT_RECORD
STOP_RECORD = supervise.STOP_RECORD
LAUNCH_RECORD = "launch.json"
# Written just before the job's supervisor is spawned, kept until the job's next attempt and
# marked ``ended`` before that attempt's records go (``never_started`` reads it).
SPAWN_RECORD = "spawned.json"
NOTICE_DIR = "notice"
PREEMPT_FILE = "preempt_at"


def read_launch(job_dir: Path) -> LaunchJob | None:
    """The launch the job's newest attempt here came from (``launch.json``); None if unreadable."""
    try:
        return LaunchJob.model_validate_json((job_dir / LAUNCH_RECORD).read_bytes())
    except (OSError, ValueError):
        return None


def remove_records(job_dir: Path) -> None:
    """``process.json`` first: an ``exit.json`` left without one is never read (and a relaunch
    removes it). The spawn record says first that the attempt ended
    (:meth:`agents.runner.JobRunner.never_started`): where it cannot, the records stay."""
    if not spawn_ended(job_dir):
        return
    for name in (PROCESS_RECORD, EXIT_RECORD, STOP_RECORD):
        (job_dir / name).unlink(missing_ok=True)


def spawn_ended(job_dir: Path) -> bool:
    """Mark the job's spawn record (if any): its attempt is over (ran, or refused by its
    supervisor). False if it cannot be written."""
    path = job_dir / SPAWN_RECORD
    record = supervise.read_json(path)
    if record is None or record.get("ended"):
        return True
    try:
        supervise.write_json_atomically(path, {**record, "ended": True}, mode=0o600)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)
        return False
    return True


def spawn_abandoned(job_dir: Path, launch_id: str) -> bool:
    """Whether the spawn record of ``launch_id`` is of a supervisor that never started the job:
    not marked ended, older than a supervisor has to answer, and no supervisor holds the job
    directory's lock (``supervise.SUPERVISOR_LOCK``: taken before anything else, held for life)."""
    path = job_dir / SPAWN_RECORD
    record = supervise.read_json(path)
    if not isinstance(record, dict) or record.get("ended") or record.get("launch_id") != launch_id:
        return False
    try:
        if time.time() - path.stat().st_mtime < SUPERVISOR_START_SECONDS:
            return False
    except OSError:
        return False
    return not supervise.lock_held(job_dir)  # (held: still starting, or cannot write its records)


def write_stop(job_dir: Path, job_id: int, reason: str, error: str | None, kill_at: float) -> None:
    """Why the agent ends the job and when SIGKILL is due, for its supervisor's ``exit.json`` and
    for an agent that adopts the job meanwhile."""
    try:
        supervise.write_json_atomically(job_dir / STOP_RECORD, {"reason": reason, "error": error, "kill_at": kill_at})
    except OSError as exc:  # the agent still knows; only an adopting agent would not
        log.warning("job %d: cannot write %s: %s", job_id, STOP_RECORD, exc)


def write_preempt_notice(path: Path, job_id: int, kill_at: float) -> None:
    """The SIGKILL deadline, unix seconds on one line; written whole (a rename) so the job
    never reads half a number, group-readable (the notice directory gives it the job's group)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, f"{int(kill_at)}\n".encode())
            os.fchmod(fd, 0o640)  # whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:  # the job still gets its signal and its grace
        log.warning("job %d: cannot write its preemption notice %s: %s", job_id, path, exc)
