"""What the agent runs for a notebook job (:func:`agents.notebooks.launch`): the job's own jupyter
with Colony's settings and the token moved into JUPYTER_TOKEN; without jupyter, or without a
token, only a message and exit 127; never in a container image."""

from __future__ import annotations

import subprocess

import pytest

from agents import notebooks, tunnel_protocol

TOKEN = "f" * 64


def fake_jupyter(folder):
    folder.mkdir()
    (folder / "jupyter").write_text("#!/bin/sh\n")
    (folder / "jupyter").chmod(0o755)
    return str(folder)


def test_the_server_gets_colonys_settings_and_its_token_in_the_environment(tmp_path):
    env = {"PATH": fake_jupyter(tmp_path / "bin"), tunnel_protocol.NOTEBOOK_TOKEN_ENV: TOKEN}
    argv = notebooks.launch(tmp_path, 42, 900, ["jupyter", "lab"], None, env)
    assert argv[:2] == ["jupyter", "lab"]
    assert f"--ServerApp.port={notebooks.read_port(tmp_path)}" in argv
    assert {"--ServerApp.ip=127.0.0.1", "--ServerApp.base_url=/notebooks/42/", "--ServerApp.port_retries=0",
            "--ServerApp.shutdown_no_activity_timeout=900", "--MappingKernelManager.cull_idle_timeout=900"} <= set(argv)
    assert env["JUPYTER_TOKEN"] == TOKEN and tunnel_protocol.NOTEBOOK_TOKEN_ENV not in env
    assert not any(TOKEN in arg for arg in argv)


@pytest.mark.parametrize("case", ["no jupyter", "no token"])
def test_without_jupyter_or_a_token_the_job_only_says_why(tmp_path, case):
    env = {"PATH": str(tmp_path)} if case == "no jupyter" else {"PATH": fake_jupyter(tmp_path / "bin")}
    if case == "no jupyter":
        env[tunnel_protocol.NOTEBOOK_TOKEN_ENV] = TOKEN
    argv = notebooks.launch(tmp_path, 42, 900, ["jupyter", "lab"], None, env)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=10)
    assert done.returncode == 127 and notebooks.read_port(tmp_path) is None
    assert ("`jupyter` is not installed" if case == "no jupyter" else "without its access token") in done.stderr
    assert "JUPYTER_TOKEN" not in env


def test_a_notebook_never_runs_in_a_container_image(tmp_path):
    with pytest.raises(ValueError, match="container images"):
        notebooks.launch(tmp_path, 42, 900, ["jupyter", "lab"], "pytorch:latest", {})
