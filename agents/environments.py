"""Where a job starts and which software environment it starts in: a working directory on the
node, a Python virtualenv or a conda environment, each named by path in the launch.

Activation is what ``source <venv>/bin/activate`` or ``conda activate <prefix>`` would do to the
environment, without running a shell: the environment's ``bin`` first on ``PATH`` and its marker
variables set. A path that is not such an environment is refused with a reason naming the path and
the node, so the user reads what is wrong instead of a failed ``python``.

Nothing here starts processes or talks to Redis.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from agents.protocol import LaunchJob


class EnvironmentRefused(ValueError):
    """The launch's directory or environment is not usable here; the message says why."""


def check_workdir(path: str, node: str) -> str:
    """``path`` if it is an existing directory; else :class:`EnvironmentRefused`."""
    if not os.path.exists(path):
        raise EnvironmentRefused(f"working directory {path} does not exist on node {node}")
    if not os.path.isdir(path):
        raise EnvironmentRefused(f"working directory {path} is not a directory on node {node}")
    return path


def check(cmd: LaunchJob, node: str, *, in_image: bool) -> None:
    """Refuse a venv or conda path that is not one. Inside an image the path is the image's,
    which the node cannot look into: the container reports it if it is wrong."""
    if in_image:
        return
    if cmd.venv is not None and not os.path.isfile(os.path.join(cmd.venv, "bin", "python")):
        raise EnvironmentRefused(f"venv {cmd.venv} has no bin/python on node {node}: not a virtualenv")
    if cmd.conda is not None and not os.path.isdir(os.path.join(cmd.conda, "conda-meta")):
        raise EnvironmentRefused(
            f"conda environment {cmd.conda} has no conda-meta on node {node}: not a conda environment")


def activate(env: dict[str, str], cmd: LaunchJob, base_path: str | None = None) -> dict[str, str]:
    """``env`` with the launch's venv or conda environment activated (unchanged without one).

    ``base_path`` is the ``PATH`` the environment's ``bin`` goes in front of (default: ``env``'s).
    """
    prefix = cmd.venv or cmd.conda
    if prefix is None:
        return env
    env = dict(env)
    rest = base_path if base_path is not None else env.get("PATH", "")
    env["PATH"] = os.path.join(prefix, "bin") + (os.pathsep + rest if rest else "")
    if cmd.venv is not None:
        env["VIRTUAL_ENV"] = cmd.venv
        env.pop("PYTHONHOME", None)  # would point the venv's interpreter at another stdlib
    else:
        env["CONDA_PREFIX"] = cmd.conda
        # What `conda activate` shows: the name of an environment under .../envs, else its path.
        path = PurePosixPath(cmd.conda.rstrip("/") or "/")
        env["CONDA_DEFAULT_ENV"] = path.name if path.parent.name == "envs" else str(path)
        env.pop("PYTHONHOME", None)
    return env
