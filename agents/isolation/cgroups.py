"""A cgroup (v2) per job under a subtree the agent may write: what driver memory limits name.

NVML's per-cgroup memory limits (:mod:`agents.isolation.memory_limits`) take a cgroup's path, so
each job on a memory-limited GPU lives in ``<root>/colony-job-<id>``. The root is a delegated
subtree (systemd ``Delegate=yes`` on the agent's unit gives the agent its own cgroup, which is the
default root); ``--cgroup-root`` names another. No controller is enabled here: the driver needs
the job's membership, nothing else, so the "no internal processes" rule never bites.

The job's supervisor (:mod:`agents.supervise`) moves itself into the job's cgroup before it starts
the job, so the job is born there, before it can initialise CUDA; the supervisor stays in it until
it exits, and the cgroup is removed once it is empty (removing it also clears its limits).
Nothing here imports NVML.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
JOB_PREFIX = "colony-job-"


def own_cgroup(mount: Path = CGROUP2_MOUNT, proc_file: str = "/proc/self/cgroup") -> tuple[Path | None, str]:
    """This process's cgroup v2 directory, or None and why not (cgroup v1 or hybrid, no mount)."""
    if not (mount / "cgroup.controllers").exists():
        return None, f"no cgroup v2 hierarchy mounted at {mount} (cgroup v1 or hybrid)"
    try:
        lines = Path(proc_file).read_text().splitlines()
    except OSError as exc:
        return None, f"cannot read {proc_file}: {exc.strerror or exc}"
    for line in lines:
        if line.startswith("0::"):
            return mount / line[3:].lstrip("/"), ""
    return None, f"{proc_file} names no cgroup v2 membership"


class JobCgroups:
    """Job cgroups under ``root``: created before a job starts, removed once it is empty."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def detect(cls, root: Path | None = None) -> tuple[JobCgroups | None, str]:
        """Job cgroups under ``root`` (default: the agent's own cgroup) if it is a cgroup this
        agent may create children in; else None and why, for the operator's log."""
        if root is None:
            root, why = own_cgroup()
            if root is None:
                return None, why
        root = Path(root)
        if not (root / "cgroup.procs").is_file():
            return None, f"{root} is not a cgroup (no cgroup.procs)"
        if not os.access(root, os.W_OK | os.X_OK):
            return None, (f"cannot create cgroups under {root} (not delegated to this agent's user; "
                          "Delegate=yes in its systemd unit, or --cgroup-root)")
        return cls(root), ""

    def path(self, job_id: int) -> Path:
        return self.root / f"{JOB_PREFIX}{job_id}"

    def create(self, job_id: int) -> Path:
        """The job's cgroup, made now (one left by an earlier attempt is reused); OSError if not."""
        path = self.path(job_id)
        path.mkdir(exist_ok=True)
        return path

    def remove(self, job_id: int) -> bool:
        """Remove the job's cgroup; False while processes (its supervisor on its way out, or a
        straggler) are still in it, so the caller tries again later."""
        try:
            self._rmdir(self.path(job_id))
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            log.warning("cannot remove the cgroup of job %d (%s): %s", job_id, self.path(job_id), exc)
            return True  # nothing a retry would change; the next attempt of the job reuses it
        return True

    def _rmdir(self, path: Path) -> None:
        # A cgroup's interface files are not files to unlink: rmdir alone removes it, once empty.
        os.rmdir(path)
