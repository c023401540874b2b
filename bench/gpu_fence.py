"""On a real GPU node: do the node's fences hold against a job that does not cooperate?

Through the agent's own isolation layer and job runner (as ``python -m agents`` configures them),
as root:

1. **devices**: a job that unsets ``CUDA_VISIBLE_DEVICES`` counts the GPUs it can use (PyTorch's
   ``torch.cuda.device_count()`` where PyTorch is there, and the ``GPU`` lines of ``nvidia-smi -L``);
   a job given GPU 0 must see exactly one, a job given no GPU none (which proves the device filter
   on a one-GPU machine too);
2. **nothing outlives a job**: a job starts a ``setsid`` daemon and exits; the daemon must be gone
   by the time the job's exit is recorded;
3. **MPS** (where ``nvidia-cuda-mps-control`` is there): the daemon runs under a service account
   (root here) and jobs as ``nobody``; a job that sends ``quit`` to the control pipe must fail, and
   the daemon must still answer afterwards.

    python -m bench.gpu_fence --json fence.json

Needs root and an NVIDIA GPU (NVML); without them it says so and exits 2 at once. Exit status 0
when every check that could run held, 1 when one did not (the JSON says which and why).
Never imports Django.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/gpu_fence.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_node import EXIT_CANNOT_RUN, CannotRun  # noqa: E402

BENCH = "gpu_fence"
COUNT_GPUS = r"""
import json, os, shutil, subprocess
os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # what a hostile job does first
seen = {}
try:
    import torch
    seen["torch"] = torch.cuda.device_count()
except Exception as exc:
    seen["torch_error"] = repr(exc)[:200]
if shutil.which("nvidia-smi"):
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    seen["smi_gpus"] = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    seen["smi"] = (listed.stdout + listed.stderr).strip()[-400:]
print(json.dumps(seen))
"""
DAEMONIZE = r"""
import subprocess, sys
daemon = subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open(sys.argv[1], "w").write(str(daemon.pid))
"""


def require_root_gpu() -> None:
    from agents.backends import nvml

    if os.geteuid() != 0:
        raise CannotRun(BENCH, "it needs root (job cgroups, BPF, jobs under other accounts)")
    if not nvml.available():
        raise CannotRun(BENCH, "it needs an NVIDIA GPU, and NVML finds none "
                               "(no driver, no libnvidia-ml.so, or no nvidia-ml-py)")


def _node(workdir: Path, isolation: str, run_as, **options):
    from agents.backends.nvml import NvmlBackend
    from agents.isolation import configure
    from agents.runner import JobRunner

    backend = NvmlBackend(BENCH)
    gpus = backend.inventory()
    layer = configure(isolation, gpus, backend=backend, run_as=run_as, state_dir=workdir / "isolation", **options)
    layer.annotate(gpus)
    return backend, layer, JobRunner(workdir / "agent", run_as=run_as, isolation=layer, node=BENCH)


def _finish(runner, job_id: int, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for done in runner.poll():
            if done.job_id == job_id:
                return done
        time.sleep(0.1)
    return None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def check_devices_and_daemons(workdir: Path) -> dict:
    from agents.accounts import RunAsPolicy
    from agents.protocol import LaunchJob

    backend, layer, runner = _node(workdir, "none", RunAsPolicy(allow_root=True))
    result: dict = {"fencing": layer.fencing.summary(), "gpus": len(layer.gpus)}
    try:
        seen = {}
        for job_id, gpus in ((1, [0]), (2, [])):
            runner.launch(LaunchJob(command_id=f"fence-{job_id}", job_id=job_id, gpu_indices=gpus,
                                    argv=[sys.executable, "-c", COUNT_GPUS]))
            done = _finish(runner, job_id)
            try:
                seen[str(gpus)] = json.loads(done.output_tail.strip().splitlines()[-1]) if done else {"error": "hung"}
            except (ValueError, IndexError):
                seen[str(gpus)] = {"error": (done.output_tail if done else "")[-400:]}
        result["devices_seen"] = seen

        def count(entry):
            return entry.get("torch", entry.get("smi_gpus"))

        result["devices_ok"] = count(seen["[0]"]) == 1 and count(seen["[]"]) == 0
        pid_file = workdir / "daemon.pid"
        runner.launch(LaunchJob(command_id="fence-3", job_id=3, gpu_indices=[],
                                argv=[sys.executable, "-c", DAEMONIZE, str(pid_file)]))
        exit_record = runner.job_dir(3) / "exit.json"
        deadline = time.monotonic() + 60
        while not exit_record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        daemon = int(pid_file.read_text()) if pid_file.exists() else None
        result["daemon_pid"] = daemon
        result["daemon_outlived_job"] = daemon is not None and _alive(daemon)
        result["daemon_ok"] = daemon is not None and not result["daemon_outlived_job"]
        _finish(runner, 3)
    finally:
        runner.stop_all(5)
        runner.close()
        layer.close()
        backend.close()
    return result


def check_mps_quit(workdir: Path) -> dict:
    from agents.accounts import Account, RunAsPolicy
    from agents.isolation import IsolationUnavailable
    from agents.protocol import LaunchJob

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return {"skipped": "no nvidia-cuda-mps-control on PATH"}
    nobody = Account("nobody", 65534, 65534, (), "/nonexistent")
    run_as = RunAsPolicy(default=nobody)
    try:
        backend, layer, runner = _node(workdir, "mps", run_as, mps_service=(0, 0))
    except IsolationUnavailable as exc:
        return {"skipped": f"--isolation mps unavailable: {exc}"}
    result: dict = {"modes": dict(layer.modes)}
    try:
        shell = "echo quit | nvidia-cuda-mps-control; echo quit-exit=$?"
        runner.launch(LaunchJob(command_id="fence-mps", job_id=10, gpu_indices=[0], workdir="/tmp",
                                argv=["/bin/sh", "-c", shell]))
        done = _finish(runner, 10)
        result["client_output"] = (done.output_tail if done else "hung")[-400:]
        time.sleep(1.0)
        result["daemon_answers_after"] = layer.mps.check(0, in_use=False) is None and layer.mps.is_running(0)
        result["mps_ok"] = bool(result["daemon_answers_after"])
    finally:
        runner.stop_all(5)
        runner.close()
        layer.close()
        backend.close()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    try:
        require_root_gpu()
    except CannotRun as exc:
        print(exc)
        return EXIT_CANNOT_RUN
    workdir = Path(tempfile.mkdtemp(prefix="colony-fence-"))
    os.chmod(workdir, 0o711)
    results = {"bench": BENCH, "devices": check_devices_and_daemons(workdir / "a"),
               "mps": check_mps_quit(workdir / "b")}
    ok = results["devices"].get("devices_ok") and results["devices"].get("daemon_ok") and (
        "skipped" in results["mps"] or results["mps"].get("mps_ok"))
    results["ok"] = bool(ok)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
