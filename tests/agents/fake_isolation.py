"""Fakes for the isolation tests: NVML's memory-limit API, a cgroup tree in a temp dir, and the
fake ``nvidia-cuda-mps-control`` (``fake_mps_control.py``) behind an executable wrapper.

Nothing here touches a GPU or the host's cgroups.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import psutil

from agents.isolation.cgroups import JobCgroups

FAKE_MPS = Path(__file__).with_name("fake_mps_control.py")
MIB = 1024 * 1024
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13


class _Limits:
    """Stands in for c_nvmlGetMemoryLimits_v1_t / c_nvmlSetMemoryLimits_v1_t."""

    def __init__(self):
        self.nameSpace, self.softLimit, self.hardLimit, self.currentUsed = None, 0, 0, 0


def fake_nvml(support: str = "yes", refuse_set: tuple[str, ...] = ()) -> ModuleType:
    """A pynvml with only what the memory-limit layer calls. ``support``: "yes", "not_supported",
    "function_not_found" or "missing" (a binding without the functions). ``refuse_set``: GPU UUIDs
    whose nvmlDeviceSetMemoryLimits_v1 fails. ``nvml.set_calls`` records (uuid, namespace, soft, hard)."""
    nvml = ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    nvml.NVMLError = NVMLError
    nvml.NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    nvml.NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    nvml.set_calls, nvml.init_count = [], 0
    nvml.nvmlInit = lambda: setattr(nvml, "init_count", nvml.init_count + 1)
    nvml.nvmlShutdown = lambda: setattr(nvml, "init_count", nvml.init_count - 1)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: uuid.decode() if isinstance(uuid, bytes) else uuid
    if support == "missing":
        return nvml
    nvml.c_nvmlGetMemoryLimits_v1_t = nvml.c_nvmlSetMemoryLimits_v1_t = _Limits

    def get(handle, limits):
        if support == "not_supported":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if support == "function_not_found":
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        limits.currentUsed = 0

    def set_(handle, limits):
        if handle in refuse_set:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        nvml.set_calls.append((handle, limits.nameSpace.decode(), limits.softLimit, limits.hardLimit))

    nvml.nvmlDeviceGetMemoryLimits_v1 = get
    nvml.nvmlDeviceSetMemoryLimits_v1 = set_
    return nvml


class FakeCgroups(JobCgroups):
    """Job cgroups in a plain directory, with the kernel's rules that matter here: a new cgroup has
    a ``cgroup.procs``, and removing one that holds a live process fails with EBUSY. Nothing is
    killed (the real thing is tested on real cgroups, ``test_job_cgroups.py``)."""

    def create(self, job_id: int, **limits) -> Path:
        path = super().create(job_id, **limits)
        (path / "cgroup.procs").touch()
        return path

    def scratch(self) -> Path:
        path = super().scratch()
        (path / "cgroup.procs").touch()
        return path

    def _kill(self, path: Path, wait: float = 0.0) -> None:
        pass

    def _rmdir(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(path)
        for pid in members(path):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(path)


def members(cgroup: Path) -> list[int]:
    """The pids written to a fake cgroup's ``cgroup.procs``."""
    return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]


def cgroup_root(tmp_path: Path) -> Path:
    """A directory that looks like a delegated cgroup v2 subtree."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.procs").touch()
    return root


class FakeMps:
    """The fake control binary behind an executable wrapper (this interpreter, so psutil is there)."""

    def __init__(self, tmp_path: Path):
        self.path = tmp_path / "bin" / "nvidia-cuda-mps-control"
        self.path.parent.mkdir(exist_ok=True)
        self.path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_MPS} \"$@\"\n")
        self.path.chmod(0o755)
        self.log = tmp_path / "mps-calls.jsonl"
        self.env = {"NVIDIA_FAKE_MPS_LOG": str(self.log), "PATH": os.environ.get("PATH", "")}

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def daemon_pid(self, pipe_dir: str | Path) -> int | None:
        try:
            pid = int((Path(pipe_dir) / "fake-daemon.pid").read_text())
            return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
        except (OSError, ValueError, psutil.Error):
            return None

    def kill_all(self, state_dir: Path) -> None:
        """Never leak a fake daemon from a failing test."""
        for pid_file in [*Path(state_dir).rglob("fake-daemon.pid"), *Path(state_dir).rglob("fake-server.pid")]:
            try:
                pid = int(pid_file.read_text())
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, psutil.Error):
                pass

    def tell(self, pipe_dir: str | Path, command: str) -> None:
        """``echo COMMAND | nvidia-cuda-mps-control`` for the daemon of ``pipe_dir``."""
        subprocess.run([str(self.path)], input=command + "\n", text=True, check=True, timeout=10,
                       env={**self.env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)})
