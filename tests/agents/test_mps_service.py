"""MPS under a service account no job has: its directories are the service's (jobs are clients,
they cannot write there), the server-side defaults go through the control pipe at start, and the
GPU is held in EXCLUSIVE_PROCESS compute mode while the daemon runs. With the fake control binary
and a fake ``nvidia-smi``: no GPU here (``bench/gpu_fence.py`` proves the rest on one)."""

from __future__ import annotations

import os
import stat

import pytest

from agents.accounts import Account, RunAsPolicy
from agents.isolation import IsolationUnavailable, choose, configure
from agents.isolation.mps import MpsDaemons
from agents.protocol import GpuInfo

from .fake_isolation import FakeCgroups, FakeMps, cgroup_root

GPUS = [GpuInfo(index=0, uuid="GPU-aaaa", model="H100-80GB", memory_mib=81559)]
JOBS = Account("colony-jobs", 2001, 2001, (), "/home/colony-jobs")


@pytest.fixture
def mps(tmp_path):
    fake = FakeMps(tmp_path)
    yield fake
    fake.kill_all(tmp_path)


@pytest.fixture
def smi(tmp_path):
    """A fake nvidia-smi that records its arguments, one call a line."""
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'smi-calls'}\n")
    path.chmod(0o755)
    return path


def smi_calls(tmp_path) -> list[str]:
    log = tmp_path / "smi-calls"
    return log.read_text().splitlines() if log.exists() else []


def test_a_service_daemon_owns_its_folders_sets_server_limits_and_exclusive_compute(tmp_path, mps, smi):
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon's folders are chowned to its service account")
    daemons = MpsDaemons(mps.path, tmp_path / "state", owner=(JOBS.uid, JOBS.gid), base_env=mps.env,
                         service=(0, 0), smi=str(smi),
                         server_limits={"set_default_active_thread_percentage": "50"})
    daemons.start(0, "GPU-aaaa")
    try:
        daemon = daemons.daemons[0]
        for folder in (daemon.pipe_dir, daemon.log_dir):
            info = folder.lstat()
            # The service's, not the jobs': a job reaches the daemon's sockets but plants nothing there.
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o755)
        commands = [call["stdin"] for call in mps.calls() if call["argv"] == []]
        assert "set_default_active_thread_percentage 50\n" in commands
        assert smi_calls(tmp_path) == ["-i GPU-aaaa -c EXCLUSIVE_PROCESS"]
    finally:
        daemons.stop_all()
    assert smi_calls(tmp_path)[-1] == "-i GPU-aaaa -c DEFAULT"  # put back with the daemon


def test_without_a_service_account_the_daemon_stays_the_jobs_and_the_compute_mode_is_left_alone(tmp_path, mps, smi):
    daemons = MpsDaemons(mps.path, tmp_path / "state", base_env=mps.env, smi=str(smi))
    daemons.start(0, "GPU-aaaa")
    try:
        assert stat.S_IMODE(daemons.daemons[0].pipe_dir.lstat().st_mode) == 0o700
    finally:
        daemons.stop_all()
    assert smi_calls(tmp_path) == []


def test_mps_is_refused_when_its_service_account_is_one_jobs_run_as(tmp_path, mps, monkeypatch):
    monkeypatch.setattr(choose, "JobCgroups", FakeCgroups)
    with pytest.raises(IsolationUnavailable, match="service account .uid 2001. is one jobs run as"):
        configure("mps", list(GPUS), run_as=RunAsPolicy(default=JOBS, agent_uid=0), state_dir=tmp_path / "state",
                  mps_control=mps.path, cgroup_root=cgroup_root(tmp_path), base_env=mps.env,
                  mps_service=(JOBS.uid, JOBS.gid))
    assert [c for c in mps.calls() if c["argv"] == ["-d"]] == []
