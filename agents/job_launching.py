"""Preparing a launch: the job's directories and their owners, its environment, the checks that
refuse what must not run here, and the supervisor's one-line answer once it has the job's spec.
:class:`agents.runner.JobRunner` puts these together; nothing here keeps state.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from pathlib import Path

from agents import containers, environments, supervise
from agents.accounts import Account, identity_environment, job_environment
from agents.isolation.layer import IsolationLayer, JobFence
from agents.job_output import read_tail
from agents.job_processes import reap
from agents.job_records import NOTICE_DIR, SUPERVISOR_START_SECONDS
from agents.protocol import LaunchJob


class LaunchError(RuntimeError):
    """The job's process could not be started; the message says why, for the user."""


def stop_signal(cmd: LaunchJob) -> signal.Signals:
    return signal.Signals[cmd.stop_signal]


def supervisor_answer(process: subprocess.Popen, spec: dict) -> dict:
    """Hand the supervisor its spec and read its one-line answer: ``{"pid", "create_time"}`` or
    ``{"error"}``. A supervisor that says nothing in time is killed and its log quoted."""
    try:
        try:
            process.stdin.write(json.dumps(spec).encode())
            process.stdin.close()
        except OSError:
            pass  # it died at once; its log says why
        ready, _, _ = select.select([process.stdout], [], [], SUPERVISOR_START_SECONDS)
        line = process.stdout.readline() if ready else b""
    finally:
        process.stdout.close()
    try:
        answer = json.loads(line)
        if isinstance(answer, dict) and ("error" in answer or isinstance(answer.get("pid"), int)):
            return answer
    except ValueError:
        pass
    process.kill()
    reap(process)
    why = read_tail(Path(spec["job_dir"]) / supervise.SUPERVISOR_LOG, 500).strip().splitlines()
    return {"error": "the job's supervisor failed to start it" + (f": {why[-1]}" if why else "")}


def check_container_fence(cmd: LaunchJob, fence: JobFence,
                          container_runtime: containers.ContainerRuntime | None) -> None:
    """An image job must not run unfenced on a fenced GPU: a container reaches no MPS daemon
    (its pipes and the host's IPC are not in it), and a container that a daemon starts (docker,
    podman) is born in the daemon's cgroup, not the job's. Apptainer runs the container's
    processes as the job's own children, so they stay in its cgroup."""
    if cmd.image is None:
        return
    if fence.env.get("CUDA_MPS_PIPE_DIRECTORY"):
        raise LaunchError(f"image jobs cannot share GPU {cmd.gpu_indices[0]} through MPS on this node "
                          "(the container cannot reach its MPS daemon); run it without an image or "
                          "on a GPU of its own")
    if fence.gpu_memory_limited and container_runtime.name != "apptainer":
        raise LaunchError(f"{container_runtime.name} starts containers outside the job's cgroup, so "
                          "the driver's GPU memory limit would not hold; use apptainer on this node, or "
                          "run it without an image")


def prepare_directories(job_dir: Path, work_dir: Path, account: Account | None) -> None:
    """Create the job's directories; when switching users, the job's account gets the working
    directory (and only that) and its group may read the log and the preemption notice;
    other accounts get nothing."""
    jobs_root = job_dir.parent
    jobs_root.mkdir(parents=True, exist_ok=True)
    job_dir.mkdir(exist_ok=True)
    work_dir.mkdir(exist_ok=True)
    notice = job_dir / NOTICE_DIR
    notice.mkdir(exist_ok=True)
    # setgid: a notice written later (by the agent, as itself) gets the job's group.
    os.chmod(notice, 0o2750)
    if account is None:
        return
    os.chmod(jobs_root, 0o711)  # accounts may pass through to their own job, not list others
    os.chown(job_dir, -1, account.gid, follow_symlinks=False)
    os.chmod(job_dir, 0o750)
    os.chown(notice, -1, account.gid, follow_symlinks=False)
    os.chmod(notice, 0o2750)  # chown clears setgid
    # Not recursive: a retried job finds its previous attempt's files as they were.
    os.chown(work_dir, account.uid, account.gid, follow_symlinks=False)
    os.chmod(work_dir, 0o700)


def job_env(cmd: LaunchJob, account: Account | None, start_dir: Path, fence: JobFence, *,
            pass_env: tuple[str, ...], job_path: tuple[str, ...], isolation: IsolationLayer,
            preempt_file: Path) -> dict[str, str]:
    """The job's whole environment: the allow-list of the agent's, the spec's, its account's
    identity, its software environment, then the GPUs it was given and Colony's own variables."""
    env = job_environment(
        os.environ, cmd.env, identity_environment(account, str(start_dir)), pass_env=pass_env,
        path=job_path,
    )
    env = environments.activate(env, cmd, containers.CONTAINER_PATH if cmd.image is not None else None)
    # Set last so a job cannot pick GPUs it was not given. CUDA numbers devices fastest-first
    # unless told otherwise; PCI bus order is the order NVML (and so our indices) uses.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # A MIG instance by its MIG-... UUID, a whole GPU by its index.
    env["CUDA_VISIBLE_DEVICES"] = isolation.cuda_visible_devices(cmd.gpu_indices)
    for name, value in fence.env.items():  # the GPU's MPS daemon and the job's share of it
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["COLONY_JOB_ID"] = str(cmd.job_id)
    env["COLONY_PREEMPT_FILE"] = str(preempt_file)
    for name, value in (("COLONY_ARRAY_ID", cmd.array_id), ("COLONY_ARRAY_INDEX", cmd.array_index)):
        if value is None:
            env.pop(name, None)  # not the spec's to claim
        else:
            env[name] = str(value)
    return env
