"""The agent's systemd unit restarts a crashed agent with a back-off that systemd 252 (Debian 12)
honours, and leaves one that Redis refused failed instead of restarting it forever."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.cli import EXIT_CREDENTIALS_REFUSED

UNIT = Path(__file__).resolve().parents[2] / "agents" / "systemd" / "colony-agent@.service"


def sections() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def test_a_refused_agent_is_not_restarted():
    kept_down = sections()["Service"]["RestartPreventExitStatus"].split()
    assert str(EXIT_CREDENTIALS_REFUSED) in kept_down and "2" in kept_down


def test_restarts_are_spaced_and_limited_with_keys_every_systemd_knows():
    unit = sections()
    assert unit["Service"]["Restart"] == "on-failure"
    assert "RestartSteps" not in unit["Service"] and "RestartMaxDelaySec" not in unit["Service"]
    # Spaced: not systemd's 100 ms default. Limited: a start limit that is on (0 turns it off).
    delay = unit["Service"]["RestartSec"]
    assert delay.endswith("s") and float(delay.removesuffix("s")) >= 10
    assert unit["Unit"]["StartLimitIntervalSec"] not in ("0", "infinity")
    assert int(unit["Unit"]["StartLimitBurst"]) >= 2


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_installed_systemd_knows_every_key_of_the_unit(tmp_path):
    # ExecStart must name an executable that exists; which one does not matter to the check.
    instance = tmp_path / "colony-agent@gpu-01.service"
    instance.write_text(UNIT.read_text().replace("/opt/colony-agent/bin/colony-agent", sys.executable))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(instance)], capture_output=True, text=True,
                          timeout=60)
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    assert done.returncode == 0, (version, done.stdout + done.stderr)
    assert [line for line in (done.stdout + done.stderr).splitlines() if line.strip()] == [], version
