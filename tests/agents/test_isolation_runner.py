"""Jobs on fenced GPUs through the real runner: the MPS env, driver memory limits in a cgroup of
the job's own, refusals rather than unfenced runs, and MIG instances by their UUID."""

from __future__ import annotations

import json

import pytest

from agents.accounts import RunAsPolicy
from agents.isolation import choose, configure
from agents.protocol import GpuInfo
from agents.runner import JobRunner, LaunchError

from .fake_isolation import MIB, FakeCgroups, FakeMps, cgroup_root, fake_nvml, members
from .helpers import launch, python, wait_for

GPUS = [
    GpuInfo(index=0, uuid="GPU-aaaa", model="H100-80GB", memory_mib=81559),
    GpuInfo(index=1, uuid="GPU-bbbb", model="H100-80GB", memory_mib=81559),
]
PRINT_ENV = python(
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('CUDA_')}))"
)


@pytest.fixture(autouse=True)
def fake_cgroups(monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)


@pytest.fixture
def mps(tmp_path):
    fake = FakeMps(tmp_path)
    yield fake
    fake.kill_all(tmp_path)


def make_runner(tmp_path, flag, *, nvml=None, mps=None, gpus=GPUS):
    layer = configure(flag, list(gpus), run_as=RunAsPolicy(allow_root=True), state_dir=tmp_path / "state",
                      mps_control=mps.path if mps else tmp_path / "none", cgroup_root=cgroup_root(tmp_path),
                      nvml=nvml or fake_nvml("not_supported"), base_env=mps.env if mps else {})
    return JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True), isolation=layer)


@pytest.fixture
def runners():
    made = []
    yield made
    for runner in made:
        runner.stop_all(0)
        runner.close()
        runner.isolation.close()


def finished_env(runner, job_id):
    [done] = wait_for(runner.poll)
    assert done.job_id == job_id and done.exit_code == 0, done
    return json.loads(done.output_tail)


def test_a_shared_job_on_an_mps_gpu_gets_its_gpus_daemon_pinned_memory_and_thread_share(tmp_path, mps, runners):
    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    cmd = launch(PRINT_ENV, gpus=[1], gpu_memory_limit_mib=4096, compute_share=0.25, env={
        # A job cannot give itself more, nor talk to another daemon.
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/elsewhere",
    })
    runner.launch(cmd)
    env = finished_env(runner, cmd.job_id)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "state" / "mps" / "1" / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "state" / "mps" / "1" / "log")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_a_whole_gpu_job_on_mps_keeps_all_sms_and_a_multi_gpu_job_runs_without_mps(tmp_path, mps, runners):
    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    whole = launch(PRINT_ENV, gpus=[0], gpu_memory_limit_mib=81559,
                   env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"})
    runner.launch(whole)
    env = finished_env(runner, whole.job_id)
    assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith("/mps/0/pipe")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    pipe_0 = str(tmp_path / "state" / "mps" / "0" / "pipe")
    gang = launch(PRINT_ENV, gpus=[0, 1], env={"CUDA_MPS_PIPE_DIRECTORY": pipe_0})  # not the job's to choose
    runner.launch(gang)
    env = finished_env(runner, gang.job_id)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert not any(name.startswith("CUDA_MPS_") for name in env)


def test_a_shared_launch_over_several_mps_gpus_is_refused_not_run_as_a_plain_client(tmp_path, mps, runners):
    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    with pytest.raises(LaunchError, match="compute share on several MPS GPUs cannot be fenced"):
        runner.launch(launch(PRINT_ENV, gpus=[0, 1], compute_share=0.5, gpu_memory_limit_mib=4096))
    assert runner.running() == set()


def test_a_launch_on_an_mps_gpu_whose_daemon_is_down_is_refused_not_run_unfenced(tmp_path, mps, runners):
    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    runner.isolation.mps.daemons[0].running = False  # what a failed check leaves until the restart works
    with pytest.raises(LaunchError, match="MPS control daemon of GPU 0 is not running"):
        runner.launch(launch(PRINT_ENV, gpus=[0], compute_share=0.5))
    assert runner.running() == set()


def test_driver_limits_are_set_on_the_jobs_own_cgroup_before_it_starts_and_cleared_after(tmp_path, runners):
    nvml = fake_nvml("yes")
    runners.append(runner := make_runner(tmp_path, "memory-limit", nvml=nvml))
    shared = launch(python("import time; time.sleep(0.3)"), gpus=[0, 1], gpu_memory_limit_mib=4096,
                    compute_share=0.5)
    runner.launch(shared)
    cgroup = runner.isolation.cgroups.path(shared.job_id)
    assert cgroup.parent == tmp_path / "cgroup"
    leader = runner._jobs[shared.job_id].pid
    assert members(cgroup) == [leader]  # joined between fork and exec: the job is born there
    # Hard limit: the reservation; soft 0 for a shared job (the driver reclaims from it first).
    assert nvml.set_calls == [("GPU-aaaa", str(cgroup), 0, 4096 * MIB), ("GPU-bbbb", str(cgroup), 0, 4096 * MIB)]
    [done] = wait_for(runner.poll)
    assert done.exit_code == 0
    wait_for(lambda: runner.poll() == [] and not cgroup.exists())  # removed once its supervisor is gone

    whole = launch(python("pass"), gpus=[1], gpu_memory_limit_mib=81559)
    runner.launch(whole)
    assert nvml.set_calls[-1] == ("GPU-bbbb", str(runner.isolation.cgroups.path(whole.job_id)),
                                  81559 * MIB, 81559 * MIB)  # whole GPU: soft = hard
    wait_for(runner.poll)


def test_a_job_without_a_memory_limit_gets_a_cgroup_but_no_driver_limit(tmp_path, runners):
    nvml = fake_nvml("yes")
    runners.append(runner := make_runner(tmp_path, "memory-limit", nvml=nvml))
    cmd = launch(python("import time; time.sleep(0.2)"), gpus=[0])
    runner.launch(cmd)
    cgroup = runner.isolation.cgroups.path(cmd.job_id)
    assert members(cgroup) == [runner._jobs[cmd.job_id].pid]
    wait_for(runner.poll)
    assert nvml.set_calls == []
    wait_for(lambda: runner.poll() == [] and not cgroup.exists())


def test_a_limit_the_driver_refuses_fails_the_launch_and_leaves_no_cgroup(tmp_path, runners):
    nvml = fake_nvml("yes", refuse_set=("GPU-bbbb",))
    runners.append(runner := make_runner(tmp_path, "memory-limit", nvml=nvml))
    cmd = launch(python("print('ran')"), gpus=[0, 1], gpu_memory_limit_mib=2048, compute_share=0.5)
    with pytest.raises(LaunchError, match="refused a memory limit of 2048 MiB on GPU 1") as refused:
        runner.launch(cmd)
    assert "not started unfenced" in str(refused.value)
    assert runner.running() == set()
    assert not runner.isolation.cgroups.path(cmd.job_id).exists()
    assert not (runner.job_dir(cmd.job_id) / "output.log").exists()


def test_mig_instances_and_whole_gpus_beside_them_are_visible_by_their_uuid(tmp_path, runners):
    mig = GpuInfo(index=2, uuid="MIG-1234abcd-0000-1111-2222-333344445555", model="A100-80GB", memory_mib=9856,
                  isolation="mig", mig_profile="1g.10gb", parent_index=1)
    runners.append(runner := make_runner(tmp_path, "none", gpus=[GPUS[0], mig]))
    cmd = launch(PRINT_ENV, gpus=[2])
    runner.launch(cmd)
    assert finished_env(runner, cmd.job_id)["CUDA_VISIBLE_DEVICES"] == mig.uuid
    whole = launch(PRINT_ENV, gpus=[0])
    runner.launch(whole)
    # Our index 0 is CUDA's 0 here, but after a MIG GPU they part: whole GPUs go by UUID too.
    assert finished_env(runner, whole.job_id)["CUDA_VISIBLE_DEVICES"] == GPUS[0].uuid


def test_a_dead_mps_server_breaks_only_its_gpus_clients_and_leaves_the_daemon(tmp_path, mps, runners):
    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    layer = runner.isolation
    sleeper = python("import time; time.sleep(60)")
    on_0, whole_pair, on_1 = (launch(sleeper, gpus=[0], compute_share=0.5), launch(sleeper, gpus=[0, 1]),
                              launch(sleeper, gpus=[1], compute_share=0.5))
    for cmd in (on_0, whole_pair, on_1):
        runner.launch(cmd)
    pipe_0 = tmp_path / "state" / "mps" / "0" / "pipe"
    mps.tell(pipe_0, "start_server")
    assert layer.mps_faults(now=1.0) == []  # the server is seen
    mps.tell(pipe_0, "kill_server")
    [fault] = layer.mps_faults(now=100.0)
    assert fault.gpu_index == 0 and fault.job_ids == (on_0.job_id,)  # the multi-GPU job is no MPS client
    assert fault.reason.startswith("the MPS server of GPU 0 (pid ") and "every client on that GPU" in fault.reason
    assert [c["argv"] for c in mps.calls()].count(["-d"]) == 2  # the daemon lives on: no restart
    assert layer.mps_faults(now=200.0) == []  # reported once


def test_an_image_job_is_refused_rather_than_run_unfenced_in_a_container(tmp_path, mps, runners):
    from agents.containers import ContainerRuntime

    runners.append(runner := make_runner(tmp_path, "mps", mps=mps))
    runner.container_runtime = ContainerRuntime("docker", "/usr/bin/docker")
    with pytest.raises(LaunchError, match="cannot share GPU 0 through MPS"):
        runner.launch(launch(["train"], gpus=[0], compute_share=0.5, image="pytorch/pytorch:2.4.0"))
    (tmp_path / "b").mkdir()
    runners.append(limited := make_runner(tmp_path / "b", "memory-limit", nvml=fake_nvml("yes")))
    limited.container_runtime = ContainerRuntime("docker", "/usr/bin/docker")
    cmd = launch(["train"], gpus=[1], gpu_memory_limit_mib=4096, compute_share=0.5, image="pytorch/pytorch:2.4.0")
    with pytest.raises(LaunchError, match="docker starts containers outside the job's cgroup"):
        limited.launch(cmd)
    assert not limited.isolation.cgroups.path(cmd.job_id).exists()


def test_a_runner_without_a_configured_layer_keeps_what_the_backend_enforces_itself(tmp_path):
    from agents.backends.simulated import SimulatedBackend

    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True))
    inventory = SimulatedBackend("2xT4-16GB", "n1").inventory()
    assert [gpu.isolation for gpu in runner.isolation.annotate(inventory)] == [gpu.isolation for gpu in inventory]
    cmd = launch(PRINT_ENV, gpus=[1], gpu_memory_limit_mib=4096, compute_share=0.5,
                 env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/own-mps"})  # no MPS here: the job's own business
    runner.launch(cmd)
    try:
        env = finished_env(runner, cmd.job_id)
    finally:
        runner.close()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/own-mps"


def test_an_mps_client_reads_its_gpu_s_utilisation_alone_and_unknown_beside_others():
    from agents.backends.base import BackendSample
    from agents.isolation.layer import IsolationLayer
    from agents.protocol import GpuSample, JobGpuSample

    gpus = [GpuInfo(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=15360) for i in range(3)]
    layer = IsolationLayer(gpus, {0: "mps", 1: "mps", 2: "memory_limit"})
    layer.adopt(launch(python("pass"), job_id=7, gpus=[0]))  # MPS clients, as a launch or an adoption makes them
    layer.adopt(launch(python("pass"), job_id=8, gpus=[1]))
    layer.adopt(launch(python("pass"), job_id=9, gpus=[1, 2]))  # several GPUs: no MPS client
    reading = BackendSample(gpus=[GpuSample(index=0, util_sm=93.0), GpuSample(index=1, util_sm=99.0),
                                  GpuSample(index=2, util_sm=40.0)],
                            jobs=[JobGpuSample(job_id=7, gpu_index=0, mem_used_mib=900, util_sm=0.0),
                                  JobGpuSample(job_id=8, gpu_index=1, mem_used_mib=800, util_sm=0.0),
                                  JobGpuSample(job_id=9, gpu_index=1, mem_used_mib=700, util_sm=35.0),
                                  JobGpuSample(job_id=9, gpu_index=2, mem_used_mib=700, util_sm=38.0)],
                            unattributed_mib={0: 66})
    seen = layer.readable(reading)
    assert [(j.job_id, j.gpu_index, j.mem_used_mib, j.util_sm) for j in seen.jobs] == [
        (7, 0, 900, 93.0),  # alone on its GPU: the GPU's reading is its own
        (8, 1, 800, None),  # beside another job: NVML's 0 is no reading
        (9, 1, 700, 35.0), (9, 2, 700, 38.0)]  # no MPS client: NVML reads it right
    assert seen.gpus == reading.gpus and seen.unattributed_mib == {0: 66}
    layer.release(7)
    layer.release(8)
    others = BackendSample(gpus=reading.gpus, jobs=reading.jobs[2:])
    assert layer.readable(others) is others  # no MPS client left: the reading as it came
