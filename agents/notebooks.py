"""Notebook jobs on the node (``colony jupyter``): a Jupyter server the job's own environment
provides (as on Open OnDemand), run inside the job's sandbox like any batch job's argv, listening
on 127.0.0.1 only and demanding a token. The browser reaches it through the control plane's proxy
and the node's tunnel relay (:mod:`agents.tunnel`); nothing on the node is open to the world.

At launch (:func:`launch`) the agent looks for the program (``jupyter``) on the job's own PATH,
its venv or conda environment activated: without it the job runs only a message saying so, and
fails with 127 (its output tells the user what to install). Otherwise the agent picks a free
loopback port, writes it where the relay reads it (``notebook.port`` in the job directory, which
only the agent writes), moves the token the launch carried into ``JUPYTER_TOKEN`` (never onto a
command line, which every process on the node may read in ``/proc``) and runs the argv with the
settings Colony needs: the port, the base URL ``/notebooks/<job>/`` the proxy serves it under, and
the idle timeout (Jupyter culls idle kernels, then shuts down after that long without activity;
the job ends).

What must not live here: the relay (:mod:`agents.tunnel`), message shapes (:mod:`agents.tunnel_protocol`).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from agents import tunnel_protocol

PORT_FILE = "notebook.port"
CULL_INTERVAL_S = 60
MISSING = ("colony: `{program}` is not installed in this job's environment, so no notebook server can start.\n"
           "colony: a notebook runs the Jupyter of the job's own software environment (as on Open OnDemand):\n"
           "colony: install it there (e.g. `pip install jupyterlab` in the virtualenv you pass with --venv, or\n"
           "colony: in the conda environment of --conda) and run colony jupyter again.\n")


def pick_port() -> int:
    """A loopback port free now (the server binds it a moment later; taken meanwhile, the server
    fails to start and says so, and the job fails rather than serving on another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prepare(job_dir: Path) -> int:
    """Pick the server's port and record it for the relay; returns it."""
    port = pick_port()
    path = job_dir / PORT_FILE
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w") as out:
        out.write(f"{port}\n")
    return port


def read_port(job_dir: Path) -> int | None:
    """The port :func:`prepare` recorded for the job, or None."""
    try:
        text = (job_dir / PORT_FILE).read_text()
    except OSError:
        return None
    return int(text) if text.strip().isdigit() and 1024 <= int(text) <= 65535 else None


def server_flags(port: int, idle_s: int, base_url: str) -> list[str]:
    """What every Jupyter server (``jupyter lab``, ``jupyter notebook``, ``jupyter server``) takes."""
    return [
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False", f"--ServerApp.base_url={base_url}",
        # The Host header is the proxy's; the server is on loopback behind a token, so the DNS
        # rebinding check that refuses a non-local Host protects nothing here.
        "--ServerApp.allow_remote_access=True",
        # Who a job runs as is the agent's account policy to decide (root only where the operator
        # allowed it); Jupyter's own refusal to run as root would only second-guess it.
        "--ServerApp.allow_root=True",
        f"--ServerApp.shutdown_no_activity_timeout={idle_s}",
        f"--MappingKernelManager.cull_idle_timeout={idle_s}", "--MappingKernelManager.cull_connected=True",
        f"--MappingKernelManager.cull_interval={min(CULL_INTERVAL_S, idle_s)}",
    ]


def refusal(message: str) -> list[str]:
    """argv of a job that only says ``message`` and fails with 127, as a missing program would."""
    return ["/bin/sh", "-c", 'printf "%s" "$0" >&2; exit 127', message]


def notebook_launches(runner) -> dict[int, str]:
    """Job id -> launch id of the running jobs that serve a notebook."""
    found = {}
    for job_id, launch_id in runner.running_launches().items():
        launch = runner.launch_of(job_id)
        if launch is not None and tunnel_protocol.notebook_idle_s(launch.env) is not None:
            found[job_id] = launch_id
    return found


def launch(job_dir: Path, job_id: int, idle_s: int, argv: list[str], image: str | None,
           env: dict[str, str]) -> list[str]:
    """The argv a notebook job's supervisor runs (the runner's hook), and ``env`` made the server's:
    the launch's token moved to ``JUPYTER_TOKEN``. ValueError: it cannot run here at all."""
    if image is not None:
        raise ValueError("notebooks do not run in container images yet; leave out the image")
    token = env.pop(tunnel_protocol.NOTEBOOK_TOKEN_ENV, "")
    if len(token) < 32:
        return refusal("colony: this notebook job came without its access token; it does not start a server "
                       "anyone on the node could use.\n")
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        return refusal(MISSING.format(program=argv[0]))
    env["JUPYTER_TOKEN"] = token
    return [*argv, *server_flags(prepare(job_dir), idle_s, tunnel_protocol.notebook_base_url(job_id))]
