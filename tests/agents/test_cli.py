"""``python -m agents``: argument checking and a real agent process from start to SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents import cli, host

from .helpers import events, wait_for

REPO = Path(__file__).resolve().parents[2]


def run_agent(*args: str, env=None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agents", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_bad_node_name_exits_2_with_a_message():
    process = run_agent("--node", "bad/name", "--simulate", "8xA100-80GB")
    _out, err = process.communicate(timeout=10)
    assert process.returncode == 2
    assert "invalid node name 'bad/name'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--node", "n1", "--simulate", "8xB9000"], "unknown GPU model 'B9000'"),
        (["--node", "n1", "--backend", "simulated"], "needs --simulate SPEC"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--backend", "nvml"], "cannot be combined"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--interval", "0"], "positive number"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--duty-period", "-1"], "positive number"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--interval", "5", "--heartbeat-ttl", "5"], "--heartbeat-ttl"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--redis", "localhost:6379"], "unix:// URL"),
        (["--simulate", "1xT4-16GB"], "--node"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--host-memory", "lots"], "not a size: 'lots'"),
        # A bare number meant MiB here; colony submit reads one as GiB. Refused, never guessed.
        (["--node", "n1", "--simulate", "1xT4-16GB", "--host-memory", "20"], "give '20' a unit: 20GiB or 20MiB"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--reserve-host-memory", "4096"], "give '4096' a unit"),
        (["--node", "n1", "--simulate", "1xT4-16GB", "--cpus", "-4"], "positive number"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_memory_flags_read_sizes_as_colony_submit_does():
    args = cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--host-memory", "480 GB",
                           "--reserve-host-memory", "8192MiB", "--max-log-bytes", "1.5M"])
    assert (args.host_memory, args.reserve_host_memory, args.max_log_bytes) == (491520, 8192, 1572864)


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("COLONY_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6380/1")
    monkeypatch.chdir(tmp_path)
    args = cli.parse_args(["--node", "n1", "--simulate", "2xT4-16GB"])
    assert (args.backend, args.redis, args.interval, args.heartbeat_ttl, args.duty_period) == (
        "simulated", "redis://elsewhere:6380/1", 1.0, 10.0, 1.0
    )
    assert args.workdir == tmp_path / "var" / "agent" / "n1"
    monkeypatch.setenv("COLONY_REDIS_URL", "redis://colony:6379/0")
    assert cli.parse_args(["--node", "n1", "--simulate", "2xT4-16GB"]).redis == "redis://colony:6379/0"


def test_auto_backend_without_gpus_fails_clearly(monkeypatch, caplog):
    monkeypatch.setattr(cli.nvml, "available", lambda: False)
    assert cli.main(["--node", "n1"]) == 1
    assert "no NVIDIA GPU found" in caplog.text and "--simulate" in caplog.text


def test_agent_process_registers_and_exits_0_on_sigterm(redis_url, redis_client, tmp_path):
    process = run_agent(
        "--node", "n1", "--simulate", "2xT4-16GB", "--redis", redis_url,
        "--interval", "0.2", "--workdir", str(tmp_path / "work"), "--cpus", "6", "--host-memory", "48GiB",
    )
    try:
        [registered] = wait_for(lambda: events(redis_client, "node_registered"), timeout=10)
        assert [gpu.model for gpu in registered.gpus] == ["T4-16GB", "T4-16GB"]
        assert (registered.cpu_milli, registered.host_memory_mib) == (6000, 48 * 1024)  # what it offers jobs
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "n1 INFO" in err and "SIGTERM" in err


def test_by_default_a_node_offers_its_cores_and_memory_less_what_the_system_keeps(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263840540 kB\nMemFree:        1000 kB\n")
    monkeypatch.setattr(host, "MEMINFO", meminfo)
    monkeypatch.setattr(host, "machine_cpu_milli", lambda: 64_000)
    assert host.offer(reserve_cpus=2, reserve_memory_mib=8192) == host.HostOffer(62_000, 263840540 // 1024 - 8192)
    assert host.offer(cpus=0.5, memory_mib=2048) == host.HostOffer(500, 2048)  # what the operator says
    monkeypatch.setattr(host, "machine_cpu_milli", lambda: 2000)
    assert host.offer(reserve_cpus=4).cpu_milli == 1000  # never below one core
