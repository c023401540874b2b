"""The isolation layer through the real agent loop and Redis: the inventory says each GPU's mode,
a failed MPS service requeues its GPU's jobs (and only those) with the reason, the daemons stop at
shutdown, and an allocation failure under a limit is reported with its figures."""

from __future__ import annotations

import os
import signal

import pytest

from agents.accounts import RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.isolation import choose, configure
from agents.runner import JobRunner

from .conftest import RunningAgent
from .fake_isolation import FakeCgroups, FakeMps, cgroup_root, fake_nvml
from .helpers import events, launch, python, samples, send, wait_for

SLEEPER = python("import time; print('up', flush=True); time.sleep(60)")


@pytest.fixture
def mps(tmp_path):
    fake = FakeMps(tmp_path)
    yield fake
    fake.kill_all(tmp_path)


@pytest.fixture(autouse=True)
def fake_cgroups(monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)  # (real ones: test_job_cgroups.py)


@pytest.fixture
def agents():
    started: list[RunningAgent] = []
    yield started
    for running in started:
        if running.thread.is_alive():
            running.stop()


def start(agents, tmp_path, redis_url, flag, **options) -> RunningAgent:
    backend = SimulatedBackend("2xT4-16GB", "n1")
    layer = configure(flag, backend.inventory(), run_as=RunAsPolicy(allow_root=True), state_dir=tmp_path / "state",
                      cgroup_root=cgroup_root(tmp_path), **options)
    layer.mps_check_interval = 0.1
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True), isolation=layer)
    agent = Agent("n1", backend, redis_url, runner, interval=0.1, heartbeat_ttl=5, shutdown_grace=1.0)
    agents.append(running := RunningAgent(agent))
    return running


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def test_mps_gpus_are_registered_as_such_and_their_daemons_stop_with_the_agent(tmp_path, redis_url, redis_client,
                                                                               agents, mps):
    running = start(agents, tmp_path, redis_url, "mps", mps_control=mps.path, nvml=fake_nvml("missing"),
                    base_env=mps.env)
    [registered] = wait_for(lambda: events(redis_client, "node_registered"))
    assert [gpu.isolation for gpu in registered.gpus] == ["mps", "mps"]
    uuids = [gpu.uuid for gpu in registered.gpus]
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in mps.calls() if c["argv"] == ["-d"]] == uuids
    running.stop()
    quits = [c for c in mps.calls() if c["stdin"].strip() == "quit"]
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in quits] == uuids
    assert all(mps.daemon_pid(c["env"]["CUDA_MPS_PIPE_DIRECTORY"]) is None for c in quits)


def test_a_dead_mps_daemon_requeues_every_job_on_its_gpu_with_the_reason_and_is_restarted(
        tmp_path, redis_url, redis_client, agents, mps):
    running = start(agents, tmp_path, redis_url, "mps", mps_control=mps.path, nvml=fake_nvml("missing"),
                    base_env=mps.env)
    wait_for(lambda: events(redis_client, "node_registered"))
    on_0 = [launch(SLEEPER, gpus=[0], compute_share=0.5, gpu_memory_limit_mib=4096) for _ in range(2)]
    on_1 = launch(SLEEPER, gpus=[1], compute_share=0.5, gpu_memory_limit_mib=4096)
    for cmd in (*on_0, on_1):
        send(redis_client, "n1", cmd)
    runner = running.agent.runner
    wait_for(lambda: all("up" in (runner.job_dir(c.job_id) / "output.log").read_text()
                         for c in (*on_0, on_1) if (runner.job_dir(c.job_id) / "output.log").exists())
             and runner.running() == {c.job_id for c in (*on_0, on_1)})
    pipe_0 = tmp_path / "state" / "mps" / "0" / "pipe"
    os.kill(mps.daemon_pid(pipe_0), signal.SIGKILL)  # a crash: no quit, its files left behind

    for cmd in on_0:
        [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
        assert done.requeue and done.stopped and not done.oom and done.requeue_cause == "gpu_sharing_fault"
        assert done.error.startswith("the MPS control daemon of GPU 0 is gone")
        assert done.error.endswith("the job was stopped to run again")
    assert exited(redis_client, on_1.job_id) == [] and on_1.job_id in runner.running()
    wait_for(lambda: mps.daemon_pid(pipe_0))  # restarted
    starts = [c["env"]["CUDA_MPS_PIPE_DIRECTORY"] for c in mps.calls() if c["argv"] == ["-d"]]
    assert starts.count(str(pipe_0)) == 2
    assert starts.count(str(tmp_path / "state" / "mps" / "1" / "pipe")) == 1
    # The GPU takes MPS jobs again.
    again = launch(python("import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"), gpus=[0], compute_share=0.5)
    send(redis_client, "n1", again)
    [done] = wait_for(lambda: exited(redis_client, again.job_id))
    assert done.exit_code == 0 and done.output_tail == f"{pipe_0}\n"


OOM = python("import sys, time; time.sleep(0.5); "
             "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', flush=True); "
             "sys.exit(1)")
# Holds nearly all of its 4096 MiB limit (the simulated GPU reports it) until its allocation fails.
AT_LIMIT = {"COLONY_SIM_WORKLOAD": "idle:mem=4000,ramp=0.1"}
FAILS_AT_LIMIT = python("import sys, time; time.sleep(2); "
                        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', flush=True); "
                        "sys.exit(1)")


def test_an_allocation_failure_at_a_driver_limit_is_reported_with_the_figures(
        tmp_path, redis_url, redis_client, agents, monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)
    start(agents, tmp_path, redis_url, "memory-limit", nvml=fake_nvml("yes"))
    [registered] = wait_for(lambda: events(redis_client, "node_registered"))
    assert [gpu.isolation for gpu in registered.gpus] == ["memory_limit", "memory_limit"]
    cmd = launch(FAILS_AT_LIMIT, gpus=[1], gpu_memory_limit_mib=4096, compute_share=0.5, env=AT_LIMIT)
    send(redis_client, "n1", cmd)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=30)
    assert done.oom and done.exit_code == 1 and not done.requeue
    assert done.error.startswith(f"CUDA out of memory on GPU 1: job {cmd.job_id} hit its limit of 4096 MiB, "
                                 "enforced by the driver; it held up to ")
    assert done.error.endswith(" MiB in the node's samples")


def test_a_job_that_only_prints_out_of_memory_gets_no_oom_verdict(
        tmp_path, redis_url, redis_client, agents, monkeypatch):
    # The attack: any job can print "CUDA out of memory". The node saw it hold little of its
    # limit, so the exit is an ordinary failure; the text is passed on as the job's own claim.
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)
    start(agents, tmp_path, redis_url, "memory-limit", nvml=fake_nvml("yes"))
    wait_for(lambda: events(redis_client, "node_registered"))
    cmd = launch(OOM, gpus=[1], gpu_memory_limit_mib=4096, compute_share=0.5,
                 env={"COLONY_SIM_WORKLOAD": "idle:mem=600,ramp=0.1"})
    send(redis_client, "n1", cmd)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=30)
    assert done.exit_code == 1 and not done.oom and not done.requeue
    assert done.error.startswith("the job's output reports a CUDA allocation failure; in the node's samples it ")
    assert done.error.endswith("of its 4096 MiB limit on GPU 1, so the node does not count it as out of memory")


def test_the_same_failure_on_an_unfenced_gpu_is_an_ordinary_failure(tmp_path, redis_url, redis_client, agents):
    start(agents, tmp_path, redis_url, "none")
    cmd = launch(OOM, gpus=[0], gpu_memory_limit_mib=4096, compute_share=0.5)
    send(redis_client, "n1", cmd)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
    assert done.exit_code == 1 and not done.oom and done.error is None


def test_on_mps_gpus_a_job_alone_reads_its_gpu_s_utilisation_and_jobs_sharing_one_read_unknown(
        tmp_path, redis_url, redis_client, agents, mps):
    # On an H100 (driver 580) NVML charged both MPS clients' SM time to the MPS server: each job
    # read 0% at 98-100% GPU utilisation. The agent must not pass that 0 on as "idle".
    start(agents, tmp_path, redis_url, "mps", mps_control=mps.path, nvml=fake_nvml("missing"), base_env=mps.env)
    wait_for(lambda: events(redis_client, "node_registered"))
    sharing = [launch(SLEEPER, gpus=[0], compute_share=0.5, gpu_memory_limit_mib=4096) for _ in range(2)]
    alone = launch(SLEEPER, gpus=[1], compute_share=0.5, gpu_memory_limit_mib=4096)
    for cmd in (*sharing, alone):
        send(redis_client, "n1", cmd)
    ids = {cmd.job_id for cmd in (*sharing, alone)}

    def all_three():
        return [sample for sample in samples(redis_client) if {job.job_id for job in sample.jobs} >= ids]

    sample = wait_for(all_three)[-1]
    gpu_util = {gpu.index: gpu.util_sm for gpu in sample.gpus}
    read = {job.job_id: job for job in sample.jobs}
    assert [read[cmd.job_id].util_sm for cmd in sharing] == [None, None]
    assert all(read[cmd.job_id].mem_used_mib > 0 for cmd in (*sharing, alone))  # memory is exact per client
    assert gpu_util[0] and read[alone.job_id].util_sm == gpu_util[1] and gpu_util[1] is not None
