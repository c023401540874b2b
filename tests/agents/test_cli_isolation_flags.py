"""``python -m agents`` isolation flags: the MPS service account (``--mps-account``), the MPS
servers' own defaults (``--mps-limits``), each with its environment fallback, refused at start when
they would not fence; and the fences the agent reports being the isolation layer's own."""

from __future__ import annotations

import os
import pwd
import signal

import pytest

from agents import cli
from agents.accounts import RunAsPolicy
from agents.isolation import IsolationLayer, IsolationUnavailable, NodeFencing

from .helpers import events, wait_for
from .test_cli import run_agent
from .test_job_cgroups import bpf, cgroup_root  # noqa: F401 (fixtures)

BASE = ["--node", "n1", "--simulate", "1xT4-16GB"]
# A system account (below --min-user-uid, so no researcher maps to it) and the classic job account.
SERVICE, JOBS = "daemon", "nobody"


@pytest.fixture(autouse=True)
def as_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: only an agent running as root switches accounts")
    for name in (SERVICE, JOBS):
        try:
            pwd.getpwnam(name)
        except KeyError:
            pytest.skip(f"no {name!r} account here")


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("COLONY_AGENT_MPS_ACCOUNT", "COLONY_AGENT_MPS_LIMITS", "COLONY_AGENT_RUN_AS",
                 "COLONY_AGENT_USER_ACCOUNTS"):
        monkeypatch.delenv(name, raising=False)


def test_an_mps_account_no_job_runs_as_is_resolved_to_its_uid_and_gid():
    args = cli.parse_args([*BASE, "--user-accounts", "off", "--run-as", JOBS, "--mps-account", SERVICE])
    entry = pwd.getpwnam(SERVICE)
    assert args.mps_service == (entry.pw_uid, entry.pw_gid)
    # With researchers' own accounts too: a system account no one maps to.
    assert cli.parse_args([*BASE, "--mps-account", SERVICE]).mps_service == (entry.pw_uid, entry.pw_gid)
    assert cli.parse_args(BASE).mps_service is None  # default: the daemon stays the jobs' account


def test_the_mps_account_comes_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("COLONY_AGENT_MPS_ACCOUNT", SERVICE)
    monkeypatch.setenv("COLONY_AGENT_MPS_LIMITS", "threads=40")
    args = cli.parse_args([*BASE, "--user-accounts", "off", "--run-as", JOBS])
    assert args.mps_service == (pwd.getpwnam(SERVICE).pw_uid, pwd.getpwnam(SERVICE).pw_gid)
    assert args.mps_server_limits == {"set_default_active_thread_percentage": "40"}


@pytest.mark.parametrize("argv, message", [
    (["--user-accounts", "off", "--run-as", JOBS, "--mps-account", JOBS],
     f"--mps-account {JOBS}: jobs run as '{JOBS}' (--run-as / --run-as-tenant), so they could quit its daemon"),
    (["--user-accounts", "off", "--run-as", JOBS, "--mps-account", "root"],
     "--mps-account root: 'root' is root; name an account of its own that no job runs as"),
    (["--mps-account", "no-such-account-here"],
     "--mps-account no-such-account-here: no account 'no-such-account-here' in this node's user database"),
    # nobody (65534) is at or above --min-user-uid: a Colony user called "nobody" would run as it.
    (["--mps-account", JOBS], f"--mps-account {JOBS}: a researcher's jobs could run as '{JOBS}'"),
])
def test_an_mps_account_jobs_could_run_as_stops_the_agent_at_start(argv, message):
    process = run_agent(*BASE, *argv)
    _out, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert message in err


def test_an_mps_account_is_refused_by_an_agent_that_is_not_root():
    policy = RunAsPolicy(agent_uid=1000)
    with pytest.raises(ValueError, match="the agent is not root"):
        cli.mps_service_account(SERVICE, policy)


def test_mps_limits_become_the_servers_default_commands():
    args = cli.parse_args([*BASE, "--mps-limits", "threads=50,memory=20GiB", "--mps-limits", "threads=30"])
    assert args.mps_server_limits == {"set_default_active_thread_percentage": "30",
                                      "set_default_device_pinned_mem_limit": "0 20480M"}
    assert cli.parse_args(BASE).mps_server_limits == {}


@pytest.mark.parametrize("value, message", [
    ("threads=0", "threads=0: a whole percentage of the GPU's SMs, 1 to 100"),
    ("threads=150", "threads=150: a whole percentage"),
    ("memory=20", "give '20' a unit"),
    ("sms=50", "'sms=50': expected threads=PERCENT or memory=SIZE"),
])
def test_bad_mps_limits_stop_the_agent_at_start(value, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args([*BASE, "--mps-limits", value])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_the_agent_hands_the_mps_account_and_limits_to_the_isolation_layer(monkeypatch, tmp_path):
    seen = {}

    def configure(flag, gpus, **kwargs):
        seen.update(kwargs)
        raise IsolationUnavailable("stop here")

    monkeypatch.setattr(cli, "configure_isolation", configure)
    status = cli.main([*BASE, "--workdir", str(tmp_path), "--user-accounts", "off", "--run-as", JOBS,
                       "--mps-account", SERVICE, "--mps-limits", "threads=50"])
    assert status == 1
    assert seen["mps_service"] == (pwd.getpwnam(SERVICE).pw_uid, pwd.getpwnam(SERVICE).pw_gid)
    assert seen["mps_server_limits"] == {"set_default_active_thread_percentage": "50"}


@pytest.mark.parametrize("fencing, fences, warned", [
    (NodeFencing(cgroups=True, devices=True, limits=True, reasons=()), ("cgroup", "devices", "accounts"), None),
    (NodeFencing(cgroups=True, devices=False, reasons=("no device filter: the kernel refused it",)),
     ("cgroup", "accounts"), "no device filter (no device filter: the kernel refused it)"),
    (NodeFencing(reasons=("jobs get no cgroup of their own: /x is not a cgroup",)), ("accounts",),
     "jobs get no cgroup of their own"),
])
def test_the_fences_reported_are_the_isolation_layers_own(fencing, fences, warned):
    layer = IsolationLayer([], {}, fencing=fencing)
    reported, warnings = cli.job_fences(RunAsPolicy(agent_uid=0, user_accounts="nss"), layer)
    assert reported == fences
    if warned is None:
        assert warnings == []
    else:
        assert any(warning.startswith(warned) for warning in warnings), warnings


def test_an_agent_on_a_host_with_cgroups_and_bpf_registers_all_three_fences(
        redis_url, redis_client, tmp_path, cgroup_root, bpf):  # noqa: F811
    process = run_agent(*BASE, "--redis", redis_url, "--interval", "0.2", "--workdir", str(tmp_path / "work"),
                        "--cgroup-root", str(cgroup_root))
    try:
        [registered] = wait_for(lambda: events(redis_client, "node_registered"), timeout=30)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert registered.job_fences == ["cgroup", "devices", "accounts"]
    assert "job fences on this node: cgroup, devices, accounts" in err
