"""CUDA MPS: one control daemon per GPU, started and stopped by the agent, and each job's MPS env.

Each MPS GPU gets ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` set to that GPU's
UUID and pipe and log directories of its own (``<state>/mps/<index>/{pipe,log}``).
A single-GPU job on an MPS GPU connects to its GPU's daemon (``CUDA_MPS_PIPE_DIRECTORY``) with its
memory pinned (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and its SMs capped
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``); CUDA reads both once, at initialisation, so the duty cycle
stays the lever that acts at once.

Who owns the daemon decides what MPS fences:

- **with a service account** (``service``: an operator-chosen account no job runs as, say
  ``colony-mps``): the daemon and every control command run as it, and its pipe and log
  directories are its own (0755: jobs reach the daemon's sockets as clients, and cannot write
  there). MPS takes control commands (``quit``, ``set_default_*``, ``start_server``) only from
  the daemon's own uid and root, so a job cannot quit the daemon (and have its neighbours
  requeued) nor start one of its own on the pipes; it cannot plant a link for the daemon to
  write through either. The GPU is put in EXCLUSIVE_PROCESS compute mode (``nvidia-smi -c``, put
  back to DEFAULT when the daemon stops), so only the MPS server holds a context on it: a job that
  drops its MPS variables cannot open a context of its own beside the server and escape its caps.
  The server-side defaults (``set_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit``) are set through the control pipe at start from the
  operator's ceilings (``server_limits``);
- **without one** (the default, as before): the daemon runs as the jobs' account, in directories
  of that account (0700), never as root (see ``_run``). That fences *cooperating* jobs only: any
  job of that account can ``quit`` the daemon or talk to it as its owner.

What MPS never fences, even with a service account, is a *hostile client's own share*: the per-job
limits are client variables that CUDA reads in the client's process, so a job that rewrites its
own environment before initialising CUDA can take more SMs and pinned memory, up to the
server-side defaults; and a client's fatal fault takes every client of the server down (below).
Memory-limit GPUs (the driver's per-cgroup limit) and MIG instances fence hostile jobs; MPS fences
cooperating jobs and keeps a hostile one from the daemon.

What MPS cannot do shapes what the layer does:

- one client talks to one control daemon, and here each daemon has one GPU: a multi-GPU job runs
  without the MPS env (its GPUs are whole, and the scheduler gives whole-GPU jobs their GPUs);
- one server per uid per GPU: jobs of different uids are serialised, not shared, so nodes that
  run tenants under accounts of their own do not pick MPS (:mod:`agents.isolation.choose`);
- a client that connects to no daemon silently runs without MPS, unfenced: a daemon that is gone
  is noticed (``get_server_list`` fails), its GPU's jobs are ended and requeued, the daemon is
  restarted, and launches on that GPU are refused until it runs again;
- a fatal fault in one client takes the server, and so every client on that GPU, down: a server
  that disappears while jobs of ours use it ends and requeues them the same way.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import psutil

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
CONTROL_TIMEOUT_S = 10.0
# The agent's variables the control daemon inherits (it needs no secret of the agent's).
DAEMON_PASS_ENV = ("PATH", "LANG", "LC_*", "TZ", "NVIDIA_*", "CUDA_*")
# The variables Colony sets on an MPS job, after the job's own (it cannot override them).
MPS_JOB_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


class MpsError(RuntimeError):
    """A daemon could not be started; the message says why."""


def find_control(path: str | os.PathLike | None = None) -> str | None:
    """The control binary: ``path`` if it is an executable, else ``nvidia-cuda-mps-control`` on PATH."""
    if path is not None:
        return str(path) if os.access(path, os.X_OK) and Path(path).is_file() else None
    return shutil.which(MPS_CONTROL)


def thread_percentage(compute_share: float | None) -> int | None:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a share of the GPU's compute (None: the whole GPU)."""
    if compute_share is None:
        return None
    return max(1, min(100, round(compute_share * 100)))


@dataclass
class MpsDaemon:
    """The control daemon of one GPU."""

    index: int
    uuid: str
    pipe_dir: Path
    log_dir: Path
    running: bool = False
    servers: set[int] = field(default_factory=set)  # server pids seen since it (re)started

    def env(self) -> dict[str, str]:
        """The variables that point a client (and the control binary itself) at this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}


class MpsDaemons:
    """The node's per-GPU control daemons."""

    def __init__(self, control: str, state_dir: Path, *, owner: tuple[int, int] | None = None,
                 base_env: Mapping[str, str] | None = None, service: tuple[int, int] | None = None,
                 server_limits: Mapping[str, str] | None = None, smi: str | None = None):
        """``control``: the control binary; ``state_dir``: where the pipe and log directories go;
        ``owner``: uid and gid of the account jobs run as when not the agent's own; ``service``:
        the MPS service account's uid and gid (None: the daemon runs as ``owner``);
        ``server_limits``: control commands sent at each daemon's start (``set_default_...``
        name -> value); ``smi``: ``nvidia-smi``, to set the compute mode (None: looked up on PATH
        when there is a service account)."""
        self.control = control
        self.state_dir = Path(state_dir)
        self.service = service
        # Everything below runs as this account: the service's, else the jobs'.
        self.owner = service if service is not None else owner
        self.server_limits = dict(server_limits or {})
        self.smi = smi if smi is not None or service is None else shutil.which("nvidia-smi")
        source = os.environ if base_env is None else base_env
        self._base_env = {name: value for name, value in source.items()
                          if any(fnmatch.fnmatchcase(name, pattern) for pattern in DAEMON_PASS_ENV)}
        self.daemons: dict[int, MpsDaemon] = {}

    def _daemon_env(self, daemon: MpsDaemon) -> dict[str, str]:
        return {**self._base_env, "CUDA_VISIBLE_DEVICES": daemon.uuid, **daemon.env()}

    def _run(self, daemon: MpsDaemon, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        # As the jobs' account when they have one: the pipe and log directories are theirs, so a job
        # could plant a symlink there (say ``control`` -> /etc/passwd), and a root daemon or client
        # would write through it. As that account, the daemon can reach nothing the jobs cannot.
        user = {} if self.owner is None else {"user": self.owner[0], "group": self.owner[1], "extra_groups": []}
        return subprocess.run(
            [self.control, *argv], env=self._daemon_env(daemon), input=(stdin or "").encode(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=CONTROL_TIMEOUT_S, close_fds=True, **user,
        )

    def start(self, index: int, uuid: str) -> None:
        """Start the GPU's daemon; MpsError says why it did not."""
        root = self.state_dir / "mps" / str(index)
        daemon = self.daemons.get(index) or MpsDaemon(index, uuid, root / "pipe", root / "log")
        uid = self.owner[0] if self.owner is not None else os.geteuid()
        try:
            for folder in (daemon.pipe_dir, daemon.log_dir):
                if folder.is_dir() and not folder.is_symlink() and folder.lstat().st_uid != uid:
                    # Left by another account (the jobs' of an earlier configuration): it may hold
                    # what that account planted there, so it is not reused.
                    shutil.rmtree(folder)
            for folder in (root, daemon.pipe_dir, daemon.log_dir):
                folder.mkdir(parents=True, exist_ok=True)
                # A service's folders: jobs connect as clients, and cannot write there.
                os.chmod(folder, 0o711 if folder == root else 0o755 if self.service is not None else 0o700)
                if self.owner is not None and folder != root:
                    os.chown(folder, *self.owner, follow_symlinks=False)
        except OSError as exc:
            raise MpsError(f"cannot prepare {root}: {exc.strerror or exc}") from None
        if self._answers(daemon):
            # An earlier agent's (killed before it could quit it): its jobs may still be clients.
            daemon.running = True
            self.daemons[index] = daemon
            log.info("GPU %d: MPS control daemon already running (pipes in %s); kept", index, daemon.pipe_dir)
            return
        try:
            done = self._run(daemon, ["-d"])
        except (OSError, subprocess.SubprocessError) as exc:
            raise MpsError(f"{self.control} -d failed: {exc}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
            raise MpsError(f"{self.control} -d exited {done.returncode}" + (f": {why[-1]}" if why else ""))
        daemon.running, daemon.servers = True, set()
        self.daemons[index] = daemon
        log.info("GPU %d: MPS control daemon started (pipes in %s)", index, daemon.pipe_dir)
        self._fence_server(daemon)

    def _fence_server(self, daemon: MpsDaemon) -> None:
        """The server-side defaults, and EXCLUSIVE_PROCESS compute mode under a service account."""
        for name, value in self.server_limits.items():
            done = self._run(daemon, [], f"{name} {value}\n")
            if done.returncode != 0:
                log.warning("GPU %d: MPS %s %s exited %d", daemon.index, name, value, done.returncode)
        if self.service is not None:
            self._compute_mode(daemon, "EXCLUSIVE_PROCESS")

    def _compute_mode(self, daemon: MpsDaemon, mode: str) -> None:
        if self.smi is None:
            log.warning("GPU %d: no nvidia-smi: compute mode left as it is (a job that drops its MPS variables "
                        "can open a context beside the MPS server)", daemon.index)
            return
        try:
            done = subprocess.run([self.smi, "-i", daemon.uuid, "-c", mode], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=CONTROL_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("GPU %d: cannot set compute mode %s: %s", daemon.index, mode, exc)
            return
        if done.returncode != 0:
            log.warning("GPU %d: nvidia-smi -c %s exited %d: %s", daemon.index, mode, done.returncode,
                        done.stdout.decode("utf-8", "replace").strip()[:200])
        else:
            log.info("GPU %d: compute mode %s", daemon.index, mode)

    def _answers(self, daemon: MpsDaemon) -> bool:
        if not (daemon.pipe_dir / "control").exists():
            return False  # no daemon ever made its control pipe there: nothing to ask
        try:
            return self._run(daemon, [], "get_server_list\n").returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def stop(self, index: int) -> None:
        """``echo quit | nvidia-cuda-mps-control`` for the GPU's daemon; best effort."""
        daemon = self.daemons.get(index)
        if daemon is None:
            return
        try:
            done = self._run(daemon, [], "quit\n")
            if done.returncode != 0:
                log.warning("GPU %d: MPS quit exited %d", index, done.returncode)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("GPU %d: could not tell the MPS control daemon to quit: %s", index, exc)
        daemon.running = False
        if self.service is not None:
            self._compute_mode(daemon, "DEFAULT")

    def stop_all(self) -> None:
        for index in sorted(self.daemons):
            self.stop(index)

    def env_for(self, index: int) -> dict[str, str]:
        return self.daemons[index].env()

    def is_running(self, index: int) -> bool:
        daemon = self.daemons.get(index)
        return daemon is not None and daemon.running

    def check(self, index: int, in_use: bool) -> str | None:
        """Why the GPU's MPS service failed since the last check (None: it is fine).

        A daemon that no longer answers failed; so did a server we saw that is gone while ``in_use``
        (jobs of ours were its clients). A server that ends after its last client is no fault.
        """
        daemon = self.daemons.get(index)
        if daemon is None or not daemon.running:
            return None
        try:
            done = self._run(daemon, [], "get_server_list\n")
        except (OSError, subprocess.SubprocessError) as exc:
            done = None
            why = str(exc)
        if done is None or done.returncode != 0:
            if done is not None:
                why = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[:200] or f"exit {done.returncode}"
            daemon.running = False
            return f"the MPS control daemon of GPU {index} is gone ({why})"
        servers = {int(word) for word in done.stdout.decode("utf-8", "replace").split() if word.isdigit()}
        lost = {pid for pid in daemon.servers - servers if not _alive(pid)}
        daemon.servers = servers
        if lost and in_use:
            return f"the MPS server of GPU {index} (pid {min(lost)}) died, taking every client on that GPU with it"
        return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
