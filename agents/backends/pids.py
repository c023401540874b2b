"""Which job owns a process: the pid -> job mapping behind per-job GPU memory.

The agent started every job's leader in its own session and process group, so a process belongs
to a job when its session or process group is the leader's pid (the cheap, common case: every
worker, data loader and ``torchrun`` child), or, for a process that left both with ``setsid()``,
when the leader is among its ancestors. Only the pids NVML reports are looked up, so the cost per
interval is a few syscalls per GPU process rather than a walk of every process on the node.

Pids are those of the agent's pid namespace; an agent in a container needs the host's
(``pid: host``) to match what NVML reports.
"""

from __future__ import annotations

import os
from typing import Mapping

import psutil

from agents.backends.base import JobProcesses


class PidOwners:
    """Maps pids to job ids for one interval; build a new one per sample (pids get reused)."""

    def __init__(self, jobs: Mapping[int, JobProcesses]):
        self._leaders = {job.pid: job.job_id for job in jobs.values()}
        self._cache: dict[int, int | None] = {}

    def job_of(self, pid: int) -> int | None:
        """The id of the job whose process tree contains ``pid``, or ``None``."""
        if pid not in self._cache:
            self._cache[pid] = self._lookup(pid)
        return self._cache[pid]

    def _lookup(self, pid: int) -> int | None:
        leaders = self._leaders
        if not leaders or pid <= 0:
            return None
        if pid in leaders:
            return leaders[pid]
        for group_of in (os.getsid, os.getpgid):
            try:
                owner = leaders.get(group_of(pid))
            except ProcessLookupError:
                return None  # gone since NVML listed it
            except OSError:
                continue  # not allowed to ask; the ancestors may still tell
            if owner is not None:
                return owner
        try:
            for parent in psutil.Process(pid).parents():
                if parent.pid in leaders:
                    return leaders[parent.pid]
        except (psutil.Error, OSError):
            return None
        return None
