"""A cgroup (v2) per job under a subtree the agent may write: what contains a job on the node.

Every job lives in ``<root>/colony-<tag>-job-<id>`` (``tag``: a short hash of the agent's state
directory, so that two agents sharing one cgroup, as in tests and a dev stack, never share a job's
cgroup). What hangs on it:

- **nothing outlives the job**: at the job's end its supervisor kills the whole cgroup
  (``cgroup.kill``; on kernels before 5.14, SIGKILL to every pid in ``cgroup.procs`` until it is
  empty), which reaches the daemons a job started with ``setsid`` or a double fork;
- the **device fence** (:mod:`agents.isolation.devices`), a BPF filter attached to it;
- **memory and CPU limits** from the request (``memory.max``, ``cpu.max``) where the ``memory``
  and ``cpu`` controllers can be enabled for the agent's children; where they cannot, the
  agent says so once at start and jobs run without them (never refused for it);
- NVML's per-cgroup **GPU memory limits** (:mod:`agents.isolation.memory_limits`), which name
  the cgroup by its path.

The root is a delegated subtree (systemd ``Delegate=yes`` on the agent's unit gives the agent its
own cgroup, which is the default root; ``--cgroup-root`` names another). The cgroup v2 hierarchy
is found in ``/proc/self/mountinfo``: ``/sys/fs/cgroup`` on a pure v2 host (Debian 12),
``/sys/fs/cgroup/unified`` on a hybrid one. To enable controllers for its children, a non-root
cgroup must hold no process itself ("no internal processes"), so the agent then moves what is in
its root (itself, supervisors of jobs it adopted, MPS daemons) into the leaf ``<root>/colony-agent``,
as systemd's delegation guide asks.

The job's supervisor (:mod:`agents.supervise`) stays outside the job's cgroup (it must survive the
kill); the job's process joins the cgroup between fork and exec, so it is born there, before it
can open a device or initialise CUDA. The agent removes the cgroup once it is empty.
Nothing here imports NVML.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from pathlib import Path

from agents.supervise import kill_cgroup

log = logging.getLogger(__name__)

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
JOB_PREFIX = "colony-"
AGENT_LEAF = "colony-agent"
LIMIT_CONTROLLERS = ("memory", "cpu")
CPU_PERIOD_US = 100_000


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (pure v2 or hybrid), None if nowhere."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return CGROUP2_MOUNT if (CGROUP2_MOUNT / "cgroup.controllers").exists() else None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
            # Octal escapes (\040 for a space) as the kernel writes them.
            return Path(fields[0].split()[4].encode().decode("unicode_escape"))
    return None


def own_cgroup(mount: Path | None = None, proc_file: str = "/proc/self/cgroup") -> tuple[Path | None, str]:
    """This process's cgroup v2 directory, or None and why not (no v2 hierarchy mounted)."""
    mount = cgroup2_mount() if mount is None else mount
    if mount is None or not (mount / "cgroup.controllers").exists():
        return None, "no cgroup v2 hierarchy is mounted (a cgroup v1 host)"
    try:
        lines = Path(proc_file).read_text().splitlines()
    except OSError as exc:
        return None, f"cannot read {proc_file}: {exc.strerror or exc}"
    for line in lines:
        if line.startswith("0::"):
            own = mount / line[3:].strip().lstrip("/")
            # Once moved into its leaf (an earlier configure in this process), the root is the parent.
            return (own.parent if own.name == AGENT_LEAF else own), ""
    return None, f"{proc_file} names no cgroup v2 membership"


def agent_tag(state_dir: Path) -> str:
    return hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:8]


class JobCgroups:
    """Job cgroups under ``root``: created before a job starts, killed and removed after it."""

    def __init__(self, root: Path, tag: str = ""):
        self.root = Path(root)
        self.tag = tag
        self.controllers: set[str] = set()  # enabled for the jobs' cgroups
        self.limits_why_not = "controllers not enabled"

    @classmethod
    def detect(cls, root: Path | None = None, tag: str = "") -> tuple[JobCgroups | None, str]:
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
        return cls(root, tag), ""

    def enable_limits(self) -> str:
        """Enable the memory and cpu controllers for the jobs' cgroups where the root has them;
        returns what is missing and why ("" when both are there)."""
        try:
            available = set((self.root / "cgroup.controllers").read_text().split())
            enabled = set((self.root / "cgroup.subtree_control").read_text().split())
        except OSError as exc:
            self.limits_why_not = f"cannot read {self.root}'s controllers: {exc.strerror or exc}"
            return self.limits_why_not
        wanted = [name for name in LIMIT_CONTROLLERS if name in available and name not in enabled]
        if wanted:
            try:
                self._enable(wanted)
            except OSError as exc:
                log.warning("cannot enable %s for job cgroups under %s: %s", "+".join(wanted), self.root,
                            exc.strerror or exc)
            try:
                enabled = set((self.root / "cgroup.subtree_control").read_text().split())
            except OSError:
                pass
        self.controllers = {name for name in LIMIT_CONTROLLERS if name in enabled}
        missing = [name for name in LIMIT_CONTROLLERS if name not in self.controllers]
        self.limits_why_not = "" if not missing else (
            f"no {' and no '.join(missing)} controller for job cgroups under {self.root} "
            f"(available there: {' '.join(sorted(available)) or 'none'}): jobs run without "
            f"{' and '.join({'memory': 'host memory', 'cpu': 'CPU'}[m] + ' limits' for m in missing)}")
        return self.limits_why_not

    def _enable(self, names: list[str]) -> None:
        line = " ".join(f"+{name}" for name in names)
        try:
            _write(self.root / "cgroup.subtree_control", line)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # Processes in the root itself: into a leaf with them, then enable.
            leaf = self.root / AGENT_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in _members(self.root):
                try:
                    _write(leaf / "cgroup.procs", str(pid))
                except OSError as move:
                    if move.errno != errno.ESRCH:
                        raise
            log.info("moved the processes of %s into %s to enable controllers for job cgroups", self.root, leaf)
            _write(self.root / "cgroup.subtree_control", line)

    def path(self, job_id: int) -> Path:
        return self.root / f"{JOB_PREFIX}{self.tag + '-' if self.tag else ''}job-{job_id}"

    def scratch(self) -> Path:
        """A fresh, empty cgroup for probing what the kernel allows (remove it with :meth:`discard`)."""
        path = self.root / f"{JOB_PREFIX}{self.tag + '-' if self.tag else ''}probe-{os.getpid()}"
        path.mkdir(exist_ok=True)
        return path

    def discard(self, path: Path) -> None:
        try:
            self._rmdir(path)
        except OSError as exc:
            log.warning("cannot remove %s: %s", path, exc.strerror or exc)

    def create(self, job_id: int, *, memory_mib: int | None = None, cpu_milli: int | None = None) -> Path:
        """The job's cgroup, made now with its limits (a controller not enabled is skipped); OSError
        if not. One an earlier attempt left (its agent died) is emptied and made anew: its device
        filter names that attempt's GPUs, and filters on a cgroup add up."""
        path = self.path(job_id)
        if path.is_dir():
            self._kill(path, wait=5.0)
            self._rmdir(path)
        path.mkdir()
        if "memory" in self.controllers:
            _write(path / "memory.max", str(memory_mib * 1024 * 1024) if memory_mib else "max")
        if "cpu" in self.controllers:
            quota = max(1000, cpu_milli * CPU_PERIOD_US // 1000) if cpu_milli else None
            _write(path / "cpu.max", f"{quota if quota else 'max'} {CPU_PERIOD_US}")
        return path

    def freeze(self, job_id: int, frozen: bool) -> None:
        """Freeze (or thaw) everything in the job's cgroup. Suspension and duty cycles signal the
        job's process group, which a child that called ``setsid()`` (a daemon, a session's shell)
        has left; the freezer reaches it. The supervisor is outside the cgroup and runs on."""
        try:
            _write(self.path(job_id) / "cgroup.freeze", "1" if frozen else "0")
        except FileNotFoundError:
            pass  # not made yet, or already removed: nothing of the job runs in it
        except OSError as exc:
            log.warning("cannot %s the cgroup of job %d: %s", "freeze" if frozen else "thaw", job_id,
                        exc.strerror or exc)

    def remove(self, job_id: int) -> bool:
        """Kill what is left in the job's cgroup and remove it; False while processes (a straggler
        on its way out) are still in it, so the caller tries again later."""
        path = self.path(job_id)
        try:
            self._kill(path)
            self._rmdir(path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            log.warning("cannot remove the cgroup of job %d (%s): %s", job_id, path, exc)
            return True  # nothing a retry would change; the next attempt of the job reuses it
        return True

    def _kill(self, path: Path, wait: float = 0.0) -> None:
        if path.is_dir():
            kill_cgroup(path, wait=wait)

    def _rmdir(self, path: Path) -> None:
        # A cgroup's interface files are not files to unlink: rmdir alone removes it, once empty.
        os.rmdir(path)


def _members(path: Path) -> list[int]:
    return [int(word) for word in (path / "cgroup.procs").read_text().split()]


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
