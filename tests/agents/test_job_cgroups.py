"""Jobs in real cgroups (v2) through the real runner and supervisor: nothing a job starts outlives
it, it opens no GPU device node but its own (a BPF device filter; fake device nodes with NVIDIA's
major number stand in for the GPUs), and it cannot start in a directory its account may not enter.

These need root, a writable cgroup v2 hierarchy (pure v2, or the ``unified`` mount of a hybrid
host) and a kernel that lets us attach BPF device programs; each test says which is missing when
it skips.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import uuid
from pathlib import Path

import psutil
import pytest

from agents.accounts import Account, RunAsPolicy
from agents.isolation import configure
from agents.isolation.bpf import BpfError, DeviceRule, attach_device_filter
from agents.isolation.cgroups import JobCgroups, cgroup2_mount, own_cgroup
from agents.protocol import GpuInfo
from agents.runner import JobRunner, LaunchError
from agents.supervise import kill_cgroup

from .helpers import launch, python, wait_for

GPUS = [GpuInfo(index=0, uuid="GPU-aaaa", model="H100-80GB", memory_mib=81559),
        GpuInfo(index=1, uuid="GPU-bbbb", model="H100-80GB", memory_mib=81559)]
NOBODY = Account("nobody", 65534, 65534, (), "/nonexistent")


def _cgroup_root_or_skip() -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root: only root may make cgroups and attach BPF programs here")
    if cgroup2_mount() is None:
        pytest.skip("no cgroup v2 hierarchy mounted (a cgroup v1-only host)")
    own, why = own_cgroup()
    if own is None:
        pytest.skip(why)
    if not os.access(own, os.W_OK):
        pytest.skip(f"cannot make cgroups under {own}")
    return own


@pytest.fixture
def cgroup_root():
    """A fresh cgroup under this process's own, removed with everything in it afterwards."""
    own = _cgroup_root_or_skip()
    root = own / f"colony-test-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {own}: {exc.strerror}")
    yield root
    for child in sorted(root.iterdir(), reverse=True):
        if child.is_dir():
            kill_cgroup(child, wait=5)
            os.rmdir(child)
    kill_cgroup(root, wait=5)
    os.rmdir(root)


@pytest.fixture
def bpf(cgroup_root):
    probe = cgroup_root / "probe"
    probe.mkdir()
    try:
        attach_device_filter(probe, [DeviceRule(195, frozenset())])
    except BpfError as exc:
        pytest.skip(f"the kernel refuses BPF device programs here: {exc.strerror}")
    finally:
        os.rmdir(probe)


@pytest.fixture
def runners():
    made = []
    yield made
    for runner in made:
        runner.stop_all(0)
        runner.close()
        runner.isolation.close()


def make_runner(tmp_path, cgroup_root, run_as=None):
    run_as = run_as or RunAsPolicy(allow_root=True)
    layer = configure("none", list(GPUS), run_as=run_as, state_dir=tmp_path / "state", cgroup_root=cgroup_root)
    if layer.devices is not None:
        layer.devices.proc = tmp_path / "proc"  # no NVIDIA driver: device minors are the indices
    return JobRunner(tmp_path / "agent", run_as=run_as, isolation=layer)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_the_node_reports_its_jobs_fenced_on_a_host_with_cgroup_v2_and_bpf(tmp_path, cgroup_root, bpf, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    fencing = runner.isolation.fencing
    assert fencing.cgroups and fencing.devices and fencing.fenced
    assert fencing.kinds == ("cgroup", "devices")
    assert fencing.summary().startswith("fenced: job cgroups, device filter")
    assert [p.name for p in cgroup_root.iterdir() if p.is_dir()] == []  # the probe's cgroup is gone


def test_a_daemon_the_job_started_with_setsid_dies_with_the_job(tmp_path, cgroup_root, bpf, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    pid_file = tmp_path / "daemon.pid"
    # A double fork and a new session: out of the job's process group, reparented to init.
    daemonize = python(
        "import os, subprocess, sys\n"
        f"d = subprocess.Popen(['setsid', {str(Path(os.sys.executable))!r}, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(d.pid))\n"
        "print('daemon', d.pid)\n")
    cmd = launch(daemonize)
    runner.launch(cmd)
    cgroup = runner.isolation.cgroups.path(cmd.job_id)
    # By the time its supervisor records the exit, the daemon is gone and so is the cgroup.
    wait_for(lambda: (runner.job_dir(cmd.job_id) / "exit.json").exists(), timeout=30)
    daemon = int(pid_file.read_text())
    assert not _alive(daemon), "the job's daemon outlived it"
    assert not cgroup.exists()
    [done] = wait_for(runner.poll, timeout=30)
    assert done.exit_code == 0, done.output_tail


def test_a_job_that_unsets_cuda_visible_devices_still_opens_only_its_own_gpu(tmp_path, cgroup_root, bpf, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    dev = tmp_path / "dev"
    dev.mkdir()
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    probe = python(
        "import errno, json, os\n"
        "os.environ.pop('CUDA_VISIBLE_DEVICES', None)\n"
        "seen = {}\n"
        f"for name in ('nvidia0', 'nvidia1', 'nvidiactl', '/dev/null'):\n"
        f"    try:\n"
        f"        os.close(os.open(os.path.join({str(dev)!r}, name), os.O_RDWR)); seen[name] = 'open'\n"
        "    except OSError as exc:\n"
        "        seen[name] = errno.errorcode[exc.errno]\n"
        "print(json.dumps(seen))\n")
    cmd = launch(probe, gpus=[0])
    runner.launch(cmd)
    [done] = wait_for(runner.poll, timeout=30)
    seen = json.loads(done.output_tail)
    # Its own GPU and nvidiactl get past the filter (to a driver that is not there: ENXIO); the
    # other GPU is refused by the filter itself; other devices are as they were.
    assert seen == {"nvidia0": "ENXIO", "nvidia1": "EPERM", "nvidiactl": "ENXIO", "/dev/null": "open"}
    # From outside the job's cgroup, the same node opens (no filter on the agent).
    with pytest.raises(OSError) as outside:
        os.open(dev / "nvidia1", os.O_RDWR)
    assert outside.value.errno == errno.ENXIO


def test_a_cpu_job_opens_no_gpu(tmp_path, cgroup_root, bpf, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    os.mknod(tmp_path / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    cmd = launch(python(f"import os\ntry:\n    os.open({str(tmp_path / 'nvidia0')!r}, os.O_RDWR)\n"
                        "except OSError as exc:\n    print(exc.strerror)"))
    runner.launch(cmd)
    [done] = wait_for(runner.poll, timeout=30)
    assert done.output_tail.strip() == "Operation not permitted"


def test_a_job_cannot_start_in_a_directory_its_account_may_not_enter(tmp_path, cgroup_root, runners):
    run_as = RunAsPolicy(default=NOBODY)
    runners.append(runner := make_runner(tmp_path, cgroup_root, run_as=run_as))
    hidden = tmp_path / "hidden"
    (hidden / "sub").mkdir(parents=True)
    (hidden / "sub" / "secret.txt").write_text("root's secret\n")
    os.chmod(hidden, 0o700)
    cmd = launch(["/bin/cat", "secret.txt"], workdir=str(hidden / "sub"))
    with pytest.raises(LaunchError) as refused:
        runner.launch(cmd)
    assert str(refused.value) == f"account nobody cannot enter {hidden / 'sub'}: Permission denied"
    assert runner.running() == set()
    assert not runner.isolation.cgroups.path(cmd.job_id).exists()  # released with the refusal

    # Where the account may go, it starts (as nobody, there).
    allowed = launch(["/bin/sh", "-c", "pwd; id -u"], workdir="/tmp")
    runner.launch(allowed)
    [done] = wait_for(runner.poll, timeout=30)
    assert done.exit_code == 0 and done.output_tail.split() == ["/tmp", "65534"]


def test_memory_and_cpu_limits_are_set_where_the_controllers_are_there_and_said_missing_where_not(
        tmp_path, cgroup_root, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    cgroups: JobCgroups = runner.isolation.cgroups
    available = set((cgroup_root / "cgroup.controllers").read_text().split())
    if {"memory", "cpu"} <= available:
        assert cgroups.controllers == {"memory", "cpu"} and runner.isolation.fencing.limits
        path = cgroups.create(999, memory_mib=512, cpu_milli=1500)
        try:
            assert (path / "memory.max").read_text().strip() == str(512 * 1024 * 1024)
            assert (path / "cpu.max").read_text().split() == ["150000", "100000"]
        finally:
            os.rmdir(path)
    else:
        assert not runner.isolation.fencing.limits
        missing = [name for name in ("memory", "cpu") if name not in available]
        assert any(f"no {missing[0]}" in reason for reason in runner.isolation.fencing.reasons)
        path = cgroups.create(999, memory_mib=512, cpu_milli=1500)  # not refused for it
        os.rmdir(path)


def test_a_plain_directory_is_no_cgroup_and_the_node_says_it_is_unfenced(tmp_path):
    layer = configure("none", list(GPUS), run_as=RunAsPolicy(allow_root=True), state_dir=tmp_path / "state",
                      cgroup_root=tmp_path)
    assert not layer.fencing.fenced and layer.fencing.kinds == ()
    assert "is not a cgroup" in layer.fencing.summary() and layer.fencing.summary().startswith("unfenced")


def test_a_cgroup_an_earlier_attempt_left_is_made_anew_for_the_next_one(tmp_path, cgroup_root, bpf, runners):
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    cgroups = runner.isolation.cgroups
    left = cgroups.path(7)
    left.mkdir()  # as an attempt on GPU 1 whose agent died would leave it, with its filter
    attach_device_filter(left, [DeviceRule(195, frozenset({1}))])
    os.mknod(tmp_path / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    cmd = launch(python(f"import os\ntry:\n    os.open({str(tmp_path / 'nvidia0')!r}, os.O_RDWR)\n"
                        "except OSError as exc:\n    print(exc.strerror)"), job_id=7, gpus=[0])
    runner.launch(cmd)
    [done] = wait_for(runner.poll, timeout=30)
    assert done.output_tail.strip() == "No such device or address"  # its own GPU, past the filter


def test_a_suspended_job_freezes_whole_even_a_child_that_left_its_process_group(tmp_path, cgroup_root, runners):
    """Suspension and duty cycles signal the job's process group; a child that called setsid()
    (a daemon, an interactive session's shell) is not in it. Frozen through the cgroup, it stops
    too: a borrower cannot keep the GPU at full speed beside a guaranteed job that way."""
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    ticks = tmp_path / "ticks"
    child = tmp_path / "child.py"
    child.write_text("import time\nn = 0\nwhile True:\n    n += 1\n"
                     f"    open({str(ticks)!r}, 'w').write(str(n))\n    time.sleep(0.01)\n")
    escapee = python(
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(child)!r}], start_new_session=True,"
        " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)\n"
        "time.sleep(300)\n")
    cmd = launch(escapee)
    runner.launch(cmd)
    count = lambda: int(ticks.read_text() or 0) if ticks.exists() else 0  # noqa: E731
    wait_for(lambda: count() > 5, timeout=30)

    assert runner.suspend(cmd.job_id)
    time.sleep(0.3)  # a tick already under way lands
    frozen_at = count()
    time.sleep(1.0)
    assert count() == frozen_at, "a child outside the job's process group kept running while suspended"

    assert runner.resume(cmd.job_id)
    wait_for(lambda: count() > frozen_at + 5, timeout=10)
