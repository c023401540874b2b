"""Which isolation mode each GPU gets (``--isolation``), and the MPS daemons that come with it."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agents.accounts import Account, RunAsPolicy
from agents.isolation import IsolationUnavailable, choose, configure
from agents.protocol import GpuInfo

from .fake_isolation import FakeCgroups, FakeMps, cgroup_root, fake_nvml

GPUS = [
    GpuInfo(index=0, uuid="GPU-aaaa", model="H100-80GB", memory_mib=81559),
    GpuInfo(index=1, uuid="GPU-bbbb", model="H100-80GB", memory_mib=81559),
]
MIG = GpuInfo(index=2, uuid="MIG-cccc", model="H100-80GB", memory_mib=9856, isolation="mig",
              mig_profile="1g.10gb", parent_index=1)


@pytest.fixture
def mps(tmp_path):
    fake = FakeMps(tmp_path)
    yield fake
    fake.kill_all(tmp_path)


@pytest.fixture(autouse=True)
def fake_cgroups(monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)


def build(tmp_path, flag="auto", gpus=GPUS, *, mps=None, nvml="yes", cgroups=True, run_as=None, backend=None):
    layer = configure(
        flag, list(gpus), backend=backend, run_as=run_as or RunAsPolicy(agent_uid=1000), state_dir=tmp_path / "state",
        mps_control=mps.path if mps else tmp_path / "no-such-binary",
        cgroup_root=cgroup_root(tmp_path) if cgroups else tmp_path,  # a plain directory is no cgroup
        nvml=fake_nvml(nvml) if isinstance(nvml, str) else nvml, base_env=mps.env if mps else {},
    )
    return layer


def per_tenant_accounts() -> RunAsPolicy:
    vision = Account("colony-vision", 2001, 2001, (), "/home/colony-vision")
    nlp = Account("colony-nlp", 2002, 2002, (), "/home/colony-nlp")
    return RunAsPolicy(tenants={"vision": vision, "nlp": nlp}, agent_uid=0)


def test_auto_picks_driver_memory_limits_where_the_driver_has_them_and_keeps_mig_instances(tmp_path, mps):
    layer = build(tmp_path, gpus=[*GPUS, MIG], mps=mps)
    assert layer.modes == {0: "memory_limit", 1: "memory_limit", 2: "mig"}
    reported = layer.annotate([*GPUS, MIG])
    assert [gpu.isolation for gpu in reported] == ["memory_limit", "memory_limit", "mig"]
    assert mps.calls() == []  # no MPS daemon where the driver fences memory


@pytest.mark.parametrize("support", ["not_supported", "function_not_found", "missing"])
def test_auto_falls_back_to_mps_when_the_driver_cannot_limit_memory(tmp_path, mps, support, caplog):
    caplog.set_level(logging.INFO, "agents.isolation")
    layer = build(tmp_path, mps=mps, nvml=support)
    try:
        assert layer.modes == {0: "mps", 1: "mps"}
        starts = [call for call in mps.calls() if call["argv"] == ["-d"]]
        assert [call["env"]["CUDA_VISIBLE_DEVICES"] for call in starts] == ["GPU-aaaa", "GPU-bbbb"]
        for index, call in enumerate(starts):
            pipe, log_dir = call["env"]["CUDA_MPS_PIPE_DIRECTORY"], call["env"]["CUDA_MPS_LOG_DIRECTORY"]
            assert pipe == str(tmp_path / "state" / "mps" / str(index) / "pipe")
            assert log_dir == str(tmp_path / "state" / "mps" / str(index) / "log")
            assert (tmp_path / "state" / "mps" / str(index) / "pipe").stat().st_mode & 0o777 == 0o700
            assert mps.daemon_pid(pipe) is not None
    finally:
        layer.close()
    quits = [call for call in mps.calls() if call["stdin"].strip() == "quit"]
    assert [call["env"]["CUDA_VISIBLE_DEVICES"] for call in quits] == ["GPU-aaaa", "GPU-bbbb"]
    assert not any(mps.daemon_pid(call["env"]["CUDA_MPS_PIPE_DIRECTORY"]) for call in quits)


def test_auto_without_a_cgroup_of_their_own_for_jobs_does_not_pick_memory_limits(tmp_path, mps):
    layer = build(tmp_path, mps=mps, cgroups=False)
    try:
        assert layer.modes == {0: "mps", 1: "mps"}
    finally:
        layer.close()


def test_auto_never_picks_mps_when_tenants_run_under_accounts_of_their_own(tmp_path, mps, caplog):
    caplog.set_level(logging.INFO, "agents.isolation")
    layer = build(tmp_path, mps=mps, nvml="not_supported", run_as=per_tenant_accounts())
    assert layer.modes == {0: "unfenced", 1: "unfenced"}
    assert mps.calls() == []
    assert "one server per uid per GPU" in caplog.text


def test_auto_without_the_mps_binary_leaves_gpus_unfenced(tmp_path, caplog):
    caplog.set_level(logging.INFO, "agents.isolation")
    layer = build(tmp_path, nvml="not_supported")
    assert layer.modes == {0: "unfenced", 1: "unfenced"}
    assert "GPU 0: isolation unfenced" in caplog.text and "no-such-binary is not an executable" in caplog.text


def test_a_daemon_that_does_not_start_leaves_its_gpu_to_the_next_mode(tmp_path, mps, caplog):
    caplog.set_level(logging.INFO, "agents.isolation")
    mps.env["NVIDIA_FAKE_MPS_FAIL"] = "GPU-aaaa"
    layer = build(tmp_path, mps=mps, nvml="not_supported")
    try:
        assert layer.modes == {0: "unfenced", 1: "mps"}
        assert "GPU 0: the MPS control daemon did not start" in caplog.text
        assert "fake failure" in caplog.text
    finally:
        layer.close()


def test_explicit_none_fences_nothing_and_starts_nothing(tmp_path, mps):
    layer = build(tmp_path, "none", gpus=[*GPUS, MIG], mps=mps)
    assert layer.modes == {0: "unfenced", 1: "unfenced", 2: "mig"}
    assert mps.calls() == []


def test_a_backend_that_enforces_limits_itself_gives_its_mode(tmp_path, mps):
    class Simulated:
        name, native_isolation = "simulated", "memory_limit"

    layer = build(tmp_path, mps=mps, nvml="missing", cgroups=False, backend=Simulated())
    assert layer.modes == {0: "memory_limit", 1: "memory_limit"} and layer.native
    assert mps.calls() == []


@pytest.mark.parametrize("flag, kwargs, message", [
    ("mps", {"nvml": "not_supported"}, "no-such-binary is not an executable"),
    ("memory-limit", {"nvml": "function_not_found"}, "GPU 0: no driver memory limits: the driver has no"),
    ("memory-limit", {"cgroups": False}, "jobs cannot get a cgroup of their own"),
])
def test_an_explicit_mode_the_node_cannot_give_refuses_to_start(tmp_path, flag, kwargs, message):
    with pytest.raises(IsolationUnavailable, match=re.escape(message)) as refused:
        build(tmp_path, flag, **kwargs)
    assert str(refused.value).startswith(f"--isolation {flag}: ")


def test_explicit_mps_with_per_tenant_accounts_refuses_to_start(tmp_path, mps):
    with pytest.raises(IsolationUnavailable, match="per-tenant accounts"):
        build(tmp_path, "mps", mps=mps, run_as=per_tenant_accounts())


def test_explicit_mps_whose_daemon_fails_refuses_to_start_and_stops_the_others(tmp_path, mps):
    mps.env["NVIDIA_FAKE_MPS_FAIL"] = "GPU-bbbb"
    with pytest.raises(IsolationUnavailable, match="GPU 1 did not start"):
        build(tmp_path, "mps", mps=mps)
    started = [call for call in mps.calls() if call["argv"] == ["-d"]][0]
    assert mps.daemon_pid(started["env"]["CUDA_MPS_PIPE_DIRECTORY"]) is None


def test_the_agent_refuses_to_start_with_a_mode_it_cannot_honour(tmp_path):
    agent = subprocess.run(
        [sys.executable, "-m", "agents", "--node", "n1", "--simulate", "1xT4-16GB", "--workdir", str(tmp_path),
         "--isolation", "mps", "--mps-control", str(tmp_path / "missing"), "--redis", "redis://127.0.0.1:1/0"],
        capture_output=True, text=True, timeout=30,
    )
    assert agent.returncode == 1
    assert "--isolation mps: " in agent.stderr and "is not an executable" in agent.stderr


def test_an_isolation_mode_from_the_environment_is_checked_like_the_flag(monkeypatch):
    from agents import cli

    monkeypatch.setenv("COLONY_AGENT_ISOLATION", "strict")
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB"])
    assert exited.value.code == 2


def test_mps_daemons_and_control_commands_run_as_the_jobs_account_not_root(tmp_path, monkeypatch):
    # Jobs own the pipe and log directories: a job could plant ``control`` -> /etc/passwd there, so
    # nothing that writes through them may run as root.
    from agents.isolation.mps import MpsDaemons

    calls = []

    def run(argv, **kwargs):
        calls.append((argv[1:], kwargs.get("user"), kwargs.get("group"), tuple(kwargs.get("extra_groups", "?"))))
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(os, "chown", lambda *args, **kwargs: None)  # (the test need not run as root)
    daemons = MpsDaemons("/usr/bin/nvidia-cuda-mps-control", tmp_path, owner=(4242, 4343), base_env={})
    daemons.start(0, "GPU-aaaa")
    daemons.check(0, in_use=False)
    daemons.stop(0)
    assert [call[0] for call in calls] == [["-d"], [], []]
    assert {call[1:] for call in calls} == {(4242, 4343, ())}


def test_mps_directories_another_account_left_are_replaced_not_reused(tmp_path, monkeypatch):
    """An agent now running its daemons as itself must not reuse pipe and log directories a
    tenant account owned (and could have planted a symlink in)."""
    from agents.isolation.mps import MpsDaemons

    monkeypatch.setattr(subprocess, "run", lambda argv, **kwargs: subprocess.CompletedProcess(argv, 0, b"", b""))
    pipe = tmp_path / "mps" / "0" / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").symlink_to(tmp_path / "victim")
    # The agent now runs as another account than the one that owns what is on disk.
    monkeypatch.setattr(os, "geteuid", lambda: pipe.stat().st_uid + 1)
    MpsDaemons("/usr/bin/nvidia-cuda-mps-control", tmp_path, owner=None, base_env={}).start(0, "GPU-aaaa")
    assert pipe.is_dir() and not (pipe / "control").exists() and not (pipe / "control").is_symlink()


@pytest.mark.parametrize("soft, hard", [(0, 2**44), (4096, 1024), (-1, 1024)])
def test_a_memory_limit_the_driver_would_wrap_or_that_is_inverted_is_refused_not_set(soft, hard):
    """The driver takes bytes in 64 bits: 2**44 MiB would arrive as no limit at all."""
    from agents.isolation.memory_limits import DriverMemoryLimits, MemoryLimitError

    nvml = fake_nvml()
    limits = DriverMemoryLimits(nvml)
    with pytest.raises(MemoryLimitError, match="out of range"):
        limits.set("GPU-0", Path("/sys/fs/cgroup/colony/job-1"), soft, hard)
    assert nvml.set_calls == []
