"""Where a job starts and with what software: a working directory on the node, a virtualenv or
conda environment by path, an image run through the node's container runtime, and its array index.

Container runtimes are tested through their command-line contract, not a real daemon (there is
none where these tests run): a shim named docker/podman/apptainer, first on PATH, records its argv
and environment and runs the inner argv as the runtime would (:mod:`tests.agents.runtime_shim`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

from agents import cli, protocol, signing
from agents.accounts import Account, RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.containers import NO_RUNTIME, ContainerRefused, ContainerRuntime, find_runtime, wrap
from agents.runner import JobRunner, LaunchError

from . import runtime_shim
from .conftest import RunningAgent
from .helpers import events, gone, launch, python, send_signed, wait_for

KEY = signing.node_key("e" * 32, "n1")
SHOW = ("import json, os, sys; "
        "print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ), 'python': sys.executable}))")


@pytest.fixture
def make_runner(tmp_path):
    made: list[JobRunner] = []

    def make(**options) -> JobRunner:
        options.setdefault("run_as", RunAsPolicy(allow_root=True))
        made.append(JobRunner(tmp_path / f"agent-{len(made)}", duty_period=0.5, node="n1", **options))
        return made[-1]

    yield make
    for runner in made:
        runner.stop_all(0)
        runner.close()


def run(runner: JobRunner, cmd) -> dict:
    runner.launch(cmd)
    [done] = wait_for(runner.poll, 10)
    assert done.exit_code == 0, done.output_tail
    return json.loads(done.output_tail.splitlines()[-1])


def fake_venv(root, name="venv"):
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    return venv


def fake_conda(root):
    prefix = root / "miniconda" / "envs" / "torch"
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "bin").mkdir()
    (prefix / "bin" / "python").symlink_to(sys.executable)
    return prefix


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


# ---------------------------------------------------------------- workdir, venv and conda through the agent


def test_workdir_and_venv_through_the_agent_and_a_missing_workdir_is_named(redis_url, redis_client, start_agent,
                                                                           tmp_path):
    start_agent(redis_url, key=KEY)
    shared = tmp_path / "shared fs" / "project"
    shared.mkdir(parents=True)
    venv = fake_venv(tmp_path)
    cmd = launch(["python", "-c", SHOW], workdir=str(shared), venv=str(venv), env={"PYTHONHOME": "/nowhere"},
                 attempt=0)
    send_signed(redis_client, "n1", cmd, KEY)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=10)
    assert done.exit_code == 0, done.output_tail or done.error
    seen = json.loads(done.output_tail)
    assert seen["cwd"] == str(shared)
    assert seen["python"] == str(venv / "bin" / "python")  # `python` found on the venv's PATH
    assert seen["env"]["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert seen["env"]["VIRTUAL_ENV"] == str(venv) and "PYTHONHOME" not in seen["env"]

    for workdir, why in ((tmp_path / "no-such-dir", "does not exist"), (venv / "bin" / "python", "is not a directory")):
        bad = launch(python("print('ran')"), workdir=str(workdir), attempt=0)
        send_signed(redis_client, "n1", bad, KEY)
        [failed] = wait_for(lambda: exited(redis_client, bad.job_id), timeout=10)
        assert failed.exit_code is None
        assert failed.error == f"working directory {workdir} {why} on node n1"


def test_conda_environment_is_activated_by_path(make_runner, tmp_path):
    prefix = fake_conda(tmp_path)
    seen = run(make_runner(), launch(["python", "-c", SHOW], conda=str(prefix)))
    assert seen["env"]["PATH"].split(os.pathsep)[0] == str(prefix / "bin")
    assert (seen["env"]["CONDA_PREFIX"], seen["env"]["CONDA_DEFAULT_ENV"]) == (str(prefix), "torch")


def test_a_path_that_is_no_environment_is_refused(make_runner, tmp_path):
    runner = make_runner()
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaunchError, match=f"venv {tmp_path / 'empty'} has no bin/python on node n1"):
        runner.launch(launch(["python"], venv=str(tmp_path / "empty")))
    with pytest.raises(LaunchError, match=f"conda environment {tmp_path / 'empty'} has no conda-meta on node n1"):
        runner.launch(launch(["python"], conda=str(tmp_path / "empty")))


def test_array_index_and_id_reach_the_job_only_when_it_is_in_an_array(make_runner):
    runner = make_runner()
    member = run(runner, launch(python(SHOW), array_id=41, array_index=7))
    assert (member["env"]["COLONY_ARRAY_ID"], member["env"]["COLONY_ARRAY_INDEX"]) == ("41", "7")
    single = run(runner, launch(python(SHOW), env={"COLONY_ARRAY_INDEX": "3"}))
    assert "COLONY_ARRAY_ID" not in single["env"] and "COLONY_ARRAY_INDEX" not in single["env"]


# ---------------------------------------------------------------- images


@pytest.fixture
def shim_path(tmp_path, monkeypatch):
    """``shim_path(name)`` installs the ``name`` shim first on PATH; returns its record file."""
    folder = tmp_path / "runtime-bin"

    def install(name: str):
        record = runtime_shim.install(folder, name)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        return record

    return install


def test_an_image_job_runs_through_docker_with_its_gpus_mount_and_no_secret_on_the_command_line(
        redis_url, redis_client, shim_path, tmp_path):
    record = shim_path("docker")
    args = cli.parse_args(["--node", "n1", "--simulate", "4xT4-16GB", "--container-runtime", "docker",
                           "--workdir", str(tmp_path / "agent"), "--allow-root-jobs"])
    assert args.runtime.path == str(tmp_path / "runtime-bin" / "docker")
    runner = JobRunner(args.workdir, run_as=RunAsPolicy(allow_root=True), container_runtime=args.runtime)
    running = RunningAgent(Agent("n1", SimulatedBackend("4xT4-16GB", "n1"), redis_url, runner, interval=0.1,
                                 key=KEY, shutdown_grace=1.0))
    try:
        [registered] = wait_for(lambda: events(redis_client, "node_registered"))
        assert registered.runtimes == ["docker"]
        shared = tmp_path / "data"
        shared.mkdir()
        cmd = launch(python(SHOW), gpus=[1, 3], workdir=str(shared), image="nvcr.io/nvidia/pytorch:24.01-py3",
                     env={"WANDB_API_KEY": "hunter2"}, attempt=0, job_id=77)
        send_signed(redis_client, "n1", cmd, KEY)
        [done] = wait_for(lambda: exited(redis_client, 77), timeout=10)
    finally:
        running.stop()
    assert done.exit_code == 0, done.output_tail or done.error
    [call] = runtime_shim.calls(record)
    argv = call["argv"]
    assert argv[:6] == ["run", "--rm", "--init", "--name", "colony-77-0", "--network=host"]
    assert argv[argv.index("--gpus") + 1] == '"device=1,3"'
    assert argv[argv.index("-w") + 1] == str(shared) and f"{shared}:{shared}" in argv
    notice = runner.preempt_file(77).parent
    assert f"{notice}:{notice}:ro" in argv
    assert "--user" not in argv  # the agent does not switch users here
    assert argv[-4:] == ["nvcr.io/nvidia/pytorch:24.01-py3", *python(SHOW)]
    assert "hunter2" not in " ".join(argv)  # values travel in the client's environment
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "-e"}
    assert {"WANDB_API_KEY", "CUDA_VISIBLE_DEVICES", "COLONY_JOB_ID", "COLONY_PREEMPT_FILE"} <= passed
    assert not {"PATH", "HOME", "USER"} & passed  # the host's, not the image's
    seen = json.loads(done.output_tail)
    assert seen["cwd"] == str(shared)
    assert seen["env"]["WANDB_API_KEY"] == "hunter2"
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # the runtime numbers the job's GPUs from 0
    assert seen["env"]["COLONY_PREEMPT_FILE"] == str(notice / "preempt_at")


def test_podman_passes_gpus_by_cdi_and_apptainer_by_nv_with_its_env_prefix(make_runner, shim_path, tmp_path):
    podman_record = shim_path("podman")
    podman = make_runner(container_runtime=find_runtime("podman"))
    seen = run(podman, launch(python(SHOW), gpus=[2], image="docker.io/library/python:3.11", attempt=4, job_id=5))
    [call] = runtime_shim.calls(podman_record)
    assert call["argv"][call["argv"].index("--name") + 1] == "colony-5-4"
    assert call["argv"][call["argv"].index("--device") + 1] == "nvidia.com/gpu=2"
    assert seen["cwd"] == str(podman.work_dir(5)) and seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"

    apptainer_record = shim_path("apptainer")
    apptainer = make_runner(container_runtime=find_runtime("apptainer"))
    venv = "/opt/venv"  # a path inside the image: not checked on the node
    seen = run(apptainer, launch(python(SHOW), gpus=[0, 2], image="library://lab/train:1", venv=venv,
                                 env={"TOKEN": "hunter2"}, job_id=6))
    [call] = runtime_shim.calls(apptainer_record)
    start = str(apptainer.work_dir(6))
    assert call["argv"][:7] == ["exec", "--cleanenv", "--nv", "--pwd", start, "--bind", start]
    assert "library://lab/train:1" in call["argv"] and "hunter2" not in " ".join(call["argv"])
    assert call["env"]["APPTAINERENV_TOKEN"] == "hunter2" and "TOKEN" not in call["env"]
    assert seen["cwd"] == start and seen["env"]["TOKEN"] == "hunter2"
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,2"  # --nv shows every GPU: the host's indices pick
    assert seen["env"]["PATH"].startswith("/opt/venv/bin:") and seen["env"]["VIRTUAL_ENV"] == venv


def test_stopping_an_image_job_removes_its_container_when_the_client_must_be_killed(make_runner, shim_path):
    record = shim_path("docker")
    runner = make_runner(container_runtime=find_runtime("docker"))
    stubborn = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', os.getpid(), flush=True); time.sleep(60)")
    cmd = launch(python(stubborn), image="busybox", attempt=0, job_id=9)
    runner.launch(cmd)
    log = runner.job_dir(9) / "output.log"
    # Jobs run unbuffered, so print() writes "ready" and the pid separately: wait for the line.
    [ready] = wait_for(lambda: log.exists() and re.findall(r"^ready (\d+)\n", log.read_text(), re.M), timeout=10)
    container_pid = int(ready)
    runner.stop(9, grace_seconds=0.3)
    [done] = wait_for(runner.poll, 10)
    # The client got SIGTERM (proxied, ignored), then SIGKILL; the container outlived it until
    # the supervisor removed it by name.
    assert done.stopped and done.exit_code == -signal.SIGKILL
    assert gone(container_pid)
    assert [c["argv"] for c in runtime_shim.calls(record)][1:] == [["rm", "-f", "colony-9-0"]]
    assert runtime_shim.running_containers(record) == []


def test_image_jobs_are_refused_without_a_runtime_and_the_agent_will_not_start_with_a_missing_one(
        make_runner, tmp_path, monkeypatch, capsys):
    with pytest.raises(LaunchError) as refused:
        make_runner().launch(launch(python("pass"), image="busybox"))
    assert str(refused.value) == NO_RUNTIME
    assert NO_RUNTIME == "this node runs no container runtime (agent started without --container-runtime)"
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--container-runtime", "podman"])
    assert exit_.value.code == 2
    assert "--container-runtime: no 'podman' executable on PATH" in capsys.readouterr().err


def test_the_runtime_runs_as_the_jobs_account_and_never_takes_runtime_settings_from_the_job(tmp_path):
    account = Account(name="colony-vision", uid=1234, gid=2345, groups=(2345, 44), home="/nonexistent")
    docker = ContainerRuntime("docker", "/usr/bin/docker")
    cmd = launch(["python", "train.py"], gpus=[0], image="pytorch", attempt=1, job_id=3)
    wrapped = wrap(docker, cmd, {"COLONY_JOB_ID": "3", "PATH": "/usr/bin"}, start_dir="/srv/job", account=account)
    argv = wrapped.argv
    assert argv[argv.index("--user") + 1] == "1234:2345"
    assert argv[argv.index("--group-add") + 1] == "44"  # the account's other groups, none of the agent's
    assert wrapped.cleanup == ["/usr/bin/docker", "rm", "-f", "colony-3-1"]
    with pytest.raises(ContainerRefused, match="DOCKER_HOST would configure the node's docker"):
        wrap(docker, launch(["x"], image="i", env={"DOCKER_HOST": "tcp://evil:2375"}), {}, start_dir="/srv")
    with pytest.raises(ContainerRefused, match="cannot mount /srv/a:b"):
        wrap(docker, launch(["x"], image="i"), {}, start_dir="/srv/a:b")


def test_image_launch_record_survives_an_agent_restart(make_runner, shim_path):
    shim_path("docker")
    runtime = find_runtime("docker")
    first = make_runner(container_runtime=runtime)
    cmd = launch(python("import time; print('up', flush=True); time.sleep(60)"), image="busybox", attempt=0,
                 stop_signal="SIGINT", array_id=3, array_index=1, job_id=12)
    first.launch(cmd)
    first._cycler.close()  # the agent dies; the supervisor and the job run on
    again = JobRunner(first.workdir, run_as=RunAsPolicy(allow_root=True), container_runtime=runtime, node="n1")
    try:
        assert again.recover(grace_seconds=5) == []
        assert again.launch_of(12) == cmd  # every new field read back from launch.json
    finally:
        again.stop_all(1)
        again.close()
    assert protocol.LaunchJob.model_validate_json((first.job_dir(12) / "launch.json").read_bytes()) == cmd


@pytest.mark.parametrize("runtime, flag", [("docker", "--gpus"), ("podman", "--device")])
def test_a_container_gets_the_devices_as_the_runner_named_them_mig_uuids_included(runtime, flag):
    mig = "MIG-1234abcd-0000-1111-2222-333344445555"
    cmd = launch(["true"], gpus=[4], image="nvcr.io/nvidia/pytorch:24.01-py3", attempt=0, job_id=9)
    wrapped = wrap(ContainerRuntime(runtime, f"/usr/bin/{runtime}"), cmd, {"CUDA_VISIBLE_DEVICES": mig, "PATH": "/bin"},
                   start_dir="/tmp")
    value = wrapped.argv[wrapped.argv.index(flag) + 1]
    assert value == (f'"device={mig}"' if runtime == "docker" else f"nvidia.com/gpu={mig}")
    assert wrapped.env["CUDA_VISIBLE_DEVICES"] == "0"  # inside, the runtime numbers it from 0
