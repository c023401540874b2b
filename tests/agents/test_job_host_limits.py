"""A job's host memory and CPU request become its cgroup's ``memory.max`` and ``cpu.max``: the
launch carries them (``LaunchJob.host_memory_mib``, ``cpu_milli``) and the real runner's layer
writes them into the cgroup the job is born in.

A delegated subtree with both controllers stands in for the kernel first (a plain directory: the
values the layer hands the cgroup), then the real thing where this host's cgroup v2 has the
``memory`` controller (a hybrid host's ``unified`` mount often has none: that test says so).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.accounts import RunAsPolicy
from agents.isolation import cgroups, choose, configure
from agents.runner import JobRunner

from .fake_isolation import FakeCgroups
from .helpers import launch, python, wait_for
from .test_job_cgroups import GPUS, cgroup_root, make_runner, runners  # noqa: F401 (fixtures)

READ_OWN_LIMITS = python(
    "import pathlib\n"
    "rel = [l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines() if l.startswith('0::')][0]\n"
    "mounts = [l.split()[4] for l in open('/proc/self/mountinfo') if ' - cgroup2 ' in l]\n"
    "own = pathlib.Path(mounts[0] + rel)\n"
    "print((own / 'memory.max').read_text().strip(), (own / 'cpu.max').read_text().strip())\n")


def delegated_root_with_controllers(tmp_path: Path) -> Path:
    """A directory that looks like a delegated cgroup v2 subtree with memory and cpu enabled for
    its children."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.procs").touch()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    return root


@pytest.fixture
def fake_runners(monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)
    # The kernel makes a cgroup's interface files with it; a plain directory gets them at the write.
    monkeypatch.setattr(cgroups, "_write", lambda path, text: path.write_text(text))
    made = []
    yield made
    for runner in made:
        runner.stop_all(0)
        runner.close()
        runner.isolation.close()


def fake_runner(tmp_path) -> JobRunner:
    layer = configure("none", list(GPUS), run_as=RunAsPolicy(allow_root=True), state_dir=tmp_path / "state",
                      cgroup_root=delegated_root_with_controllers(tmp_path))
    assert layer.fencing.limits and layer.cgroups.controllers == {"memory", "cpu"}
    return JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True), isolation=layer)


def test_a_launch_with_a_host_memory_and_cpu_request_gets_them_as_its_cgroups_limits(tmp_path, fake_runners):
    fake_runners.append(runner := fake_runner(tmp_path))
    cmd = launch(python("import time; time.sleep(0.5)"), gpus=[0], host_memory_mib=2048, cpu_milli=1500)
    runner.launch(cmd)
    cgroup = runner.isolation.cgroups.path(cmd.job_id)
    assert (cgroup / "memory.max").read_text() == str(2048 * 1024 * 1024)
    assert (cgroup / "cpu.max").read_text() == "150000 100000"  # 1.5 cores: 150 ms a 100 ms period
    wait_for(runner.poll, timeout=30)


def test_a_launch_without_a_request_gets_no_host_limits(tmp_path, fake_runners):
    fake_runners.append(runner := fake_runner(tmp_path))
    cmd = launch(python("import time; time.sleep(0.5)"), gpus=[0])
    runner.launch(cmd)
    cgroup = runner.isolation.cgroups.path(cmd.job_id)
    assert ((cgroup / "memory.max").read_text(), (cgroup / "cpu.max").read_text()) == ("max", "max 100000")
    wait_for(runner.poll, timeout=30)


def test_the_job_reads_its_requested_memory_max_in_a_real_cgroup(tmp_path, cgroup_root, runners):  # noqa: F811
    available = set((cgroup_root / "cgroup.controllers").read_text().split())
    if not {"memory", "cpu"} <= available:
        pytest.skip(f"no memory and cpu controllers in this host's cgroup v2 under {cgroup_root} "
                    f"(available: {' '.join(sorted(available)) or 'none'}): the limits cannot be set here")
    runners.append(runner := make_runner(tmp_path, cgroup_root))
    cmd = launch(READ_OWN_LIMITS, host_memory_mib=512, cpu_milli=1500)
    runner.launch(cmd)
    [done] = wait_for(runner.poll, timeout=30)
    assert done.exit_code == 0, done.output_tail
    assert done.output_tail.split() == [str(512 * 1024 * 1024), "150000", "100000"]
