"""What the GPU benches share: the check that a GPU and PyTorch are there, and one node's worth of
the agent's own machinery (the NVML backend, the isolation layer, the job runner) to launch jobs
through, exactly as the agent launches them, without Redis or a control plane.

Nothing here imports PyTorch (the jobs do) or Django. Every bench fails fast, with one line that
says what is missing, on a machine without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.accounts import RunAsPolicy  # noqa: E402
from agents.protocol import LaunchJob  # noqa: E402
from agents.runner import FinishedJob, JobRunner, read_tail  # noqa: E402

#: What ``--isolation`` takes: the agent's own flag (``python -m agents --isolation``).
try:
    from agents.isolation import FLAGS as ISOLATION_FLAGS  # noqa: E402
except ImportError:  # an agent from before the isolation layer
    ISOLATION_FLAGS = ("none",)

EXIT_CANNOT_RUN = 2
GIB = 1024


class CannotRun(RuntimeError):
    """The bench cannot run here; the message says what is missing and that nothing ran. Benches
    print it and exit with :data:`EXIT_CANNOT_RUN`."""

    def __init__(self, bench: str, why: str):
        super().__init__(f"{bench}: {why}; nothing was run")


def require_gpu(bench: str, python: str = sys.executable) -> None:
    """Raise :class:`CannotRun` unless NVML sees a GPU and the jobs' interpreter has CUDA PyTorch."""
    from agents.backends import nvml

    if not nvml.available():
        raise CannotRun(bench, "it needs an NVIDIA GPU, and NVML finds none "
                               "(no driver, no libnvidia-ml.so, or no nvidia-ml-py)")
    if python == sys.executable and importlib.util.find_spec("torch") is None:
        raise CannotRun(bench, f"PyTorch is not installed for {python} (pip install torch)")
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        status = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CannotRun(bench, f"cannot ask {python} whether PyTorch sees a GPU: {exc}") from None
    if status.returncode != 0:
        detail = (status.stderr.strip().splitlines() or ["torch.cuda.is_available() is False"])[-1]
        raise CannotRun(bench, f"PyTorch cannot use the GPU: {detail}")


@dataclass
class Node:
    """The agent's backend, isolation layer and runner for one bench run; :meth:`close` ends all."""

    workdir: Path
    backend: object
    gpus: list
    runner: JobRunner
    layer: object | None = None
    exits: dict[int, FinishedJob] = field(default_factory=dict)

    def mode(self, index: int) -> str:
        """The isolation mode the layer gave GPU ``index``."""
        return self.layer.mode(index) if self.layer is not None else "unfenced"

    def gpu(self, index: int):
        return next(gpu for gpu in self.gpus if gpu.index == index)

    def launch(self, job_id: int, script: str, args: list[str], gpu: int, **fields) -> LaunchJob:
        """Start ``python -c script args`` as job ``job_id`` on ``gpu`` (``fields``: the launch's
        ``gpu_memory_limit_mib``, ``compute_share``, ``duty_cycle``)."""
        command = LaunchJob(command_id=f"bench-{job_id}-{time.time_ns()}", job_id=job_id, gpu_indices=[gpu],
                            argv=[sys.executable, "-c", script, *args], **fields)
        self.runner.launch(command)
        return command

    def output(self, job_id: int) -> str:
        return read_tail(self.runner.job_dir(job_id) / "output.log")

    def finished(self, job_id: int, timeout: float) -> FinishedJob | None:
        """Wait up to ``timeout`` s for job ``job_id`` to exit; its exit, or None if it runs on."""
        deadline = time.monotonic() + timeout
        while True:
            for done in self.runner.poll():
                self.exits[done.job_id] = done
            if job_id in self.exits:
                return self.exits[job_id]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def stop(self, job_id: int, grace: float = 5.0) -> FinishedJob | None:
        self.runner.stop(job_id, grace)
        return self.finished(job_id, grace + 15)

    def close(self) -> None:
        try:
            self.runner.stop_all(5)
            self.runner.close()
        finally:
            if self.layer is not None:
                self.layer.close()
            self.backend.close()


def start_node(bench: str, isolation: str, *, duty_period: float = 1.0, workdir: Path | None = None) -> Node:
    """The NVML backend, the isolation layer ``isolation`` asks for (as ``python -m agents
    --isolation`` configures it) and a job runner; jobs run as root only when the bench is root."""
    from agents.backends.nvml import NvmlBackend

    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"colony-{bench}-"))
    backend = NvmlBackend(bench)
    gpus = backend.inventory()
    if not gpus:
        backend.close()
        raise CannotRun(bench, "the NVML backend lists no device (a GPU in MIG mode without instances?)")
    run_as = RunAsPolicy(allow_root=True) if os.geteuid() == 0 else RunAsPolicy()
    layer = None
    try:
        from agents.isolation import IsolationUnavailable, configure
    except ImportError:  # an agent from before the isolation layer: every GPU unfenced
        configure = None
    if configure is not None:
        try:
            layer = configure(isolation, gpus, backend=backend, run_as=run_as, state_dir=workdir / "isolation")
        except IsolationUnavailable as exc:
            backend.close()
            raise CannotRun(bench, f"--isolation {isolation} is not available on this node: {exc}") from None
        gpus = layer.annotate(gpus)
    kwargs = {"isolation": layer} if layer is not None else {}
    runner = JobRunner(workdir / "agent", duty_period=duty_period, run_as=run_as, node=bench, **kwargs)
    return Node(workdir=workdir, backend=backend, gpus=gpus, runner=runner, layer=layer)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants so far; 0 once it is gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for member in family:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def own_cpu_seconds() -> float:
    return time.process_time()
