"""Running a job's argv in a container of the node's runtime (``--container-runtime``).

:func:`wrap` turns a job (its argv, environment, start directory, account and GPUs) into the
runtime client's command line and environment; the supervisor then starts that client as the
job's process group leader, exactly as it would start the job itself. The contract per runtime:

- docker / podman: ``run --rm --init --name colony-<job>-<attempt>``; GPUs the runtime's own way
  (docker ``--gpus "device=0,1"``, podman CDI ``--device nvidia.com/gpu=0``), which renumbers
  them from 0 inside, so ``CUDA_VISIBLE_DEVICES`` inside is ``0..n-1``; the start directory
  bind-mounted at the same path and used as ``-w``; the preemption notice directory mounted
  read-only; ``--user uid:gid`` of the job's account when the agent switches users; the
  environment as ``-e NAME`` only: the values stay in the client's environment, so no secret of
  the job appears on a command line any local user can read.
- apptainer: ``exec --cleanenv [--nv] --pwd <dir> --bind <dir>``; no daemon and no renumbering
  (``--nv`` binds every GPU, ``CUDA_VISIBLE_DEVICES`` picks the job's); the environment as
  ``APPTAINERENV_<NAME>`` variables of the client, again never on the command line.

Variables that would configure the runtime client itself (``DOCKER_HOST``, ``APPTAINER_BIND`` ...)
are refused in a job's environment: they are meant for the node, not the job.

Only command lines are built here; nothing is started.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from agents.accounts import Account
from agents.protocol import LaunchJob

RUNTIMES = ("docker", "podman", "apptainer")
NO_RUNTIME = "this node runs no container runtime (agent started without --container-runtime)"
# The PATH a venv or conda environment inside an image goes in front of (the image's own PATH is
# not known to the node): what docker and the OCI images it runs use.
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The node's own variables, meaningless (or harmful) inside an image, unless the job asked for them.
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LD_LIBRARY_PATH"})
RUNTIME_ENV_PREFIXES = ("DOCKER_", "PODMAN_", "CONTAINER_", "CONTAINERS_", "BUILDAH_", "APPTAINER", "SINGULARITY")
# /dev/shm of a docker container is 64 MiB by default: too small for PyTorch's data loader workers.
SHM_SIZE = "16g"


class ContainerRefused(ValueError):
    """The job cannot run in a container here; the message says why, for the user."""


@dataclass(frozen=True)
class ContainerRuntime:
    """A runtime the agent was started with: its name and the client binary found at start."""

    name: str
    path: str


@dataclass(frozen=True)
class ContainerLaunch:
    """What the supervisor starts instead of the job's argv."""

    argv: list[str]
    env: dict[str, str]  # the runtime client's environment
    #: Removes the container once the client is gone: a SIGKILLed docker or podman client leaves
    #: its container running under the daemon. None where the container dies with the client.
    cleanup: list[str] | None


def find_runtime(name: str, search_path: str | None = None) -> ContainerRuntime:
    """The runtime ``name`` if its client is on ``search_path`` (default ``$PATH``); ValueError if not."""
    if name not in RUNTIMES:
        raise ValueError(f"unknown container runtime {name!r} (one of {', '.join(RUNTIMES)})")
    path = shutil.which(name, path=search_path)
    if path is None:
        raise ValueError(f"no {name!r} executable on PATH; install {name} or start the agent without "
                         "--container-runtime")
    return ContainerRuntime(name, os.path.abspath(path))


def container_name(cmd: LaunchJob) -> str:
    """``colony-<job>-<attempt>``: what a stop or a cleanup finds the container by."""
    if cmd.attempt is not None:
        return f"colony-{cmd.job_id}-{cmd.attempt}"
    return f"colony-{cmd.job_id}-{hashlib.sha256(cmd.command_id.encode()).hexdigest()[:8]}"


def wrap(
    runtime: ContainerRuntime | None,
    cmd: LaunchJob,
    job_env: Mapping[str, str],
    *,
    start_dir: str,
    read_only: tuple[str, ...] = (),
    account: Account | None = None,
) -> ContainerLaunch:
    """The client command line and environment that run ``cmd.argv`` in ``cmd.image``.

    ``job_env`` is the job's environment as it would start outside a container (a venv or conda
    environment activated against :data:`CONTAINER_PATH`); ``start_dir`` is mounted read-write
    and is the container's working directory; ``read_only`` directories are mounted read-only at
    the same path. Raises :class:`ContainerRefused`.
    """
    if runtime is None:
        raise ContainerRefused(NO_RUNTIME)
    clashing = sorted(name for name in cmd.env if name.upper().startswith(RUNTIME_ENV_PREFIXES))
    if clashing:
        raise ContainerRefused(f"environment variable {clashing[0]} would configure the node's {runtime.name}, "
                               "not the job; remove it from the job's env")
    for path in (start_dir, *read_only):
        if ":" in path or "," in path:
            raise ContainerRefused(f"cannot mount {path} into a container: ':' and ',' separate mount options")
    inside_names = {name for name in job_env if name not in HOST_ONLY_ENV} | set(cmd.env)
    if cmd.venv or cmd.conda:
        inside_names.add("PATH")
    inside = {name: job_env[name] for name in sorted(inside_names) if name in job_env}
    if runtime.name == "apptainer":
        return _apptainer(runtime, cmd, job_env, inside, start_dir, read_only)
    return _oci(runtime, cmd, job_env, inside, start_dir, read_only, account)


def _oci(runtime, cmd, job_env, inside, start_dir, read_only, account) -> ContainerLaunch:
    name = container_name(cmd)
    # The runtime exposes only the job's GPUs and numbers them from 0.
    inside["CUDA_VISIBLE_DEVICES"] = ",".join(str(n) for n in range(len(cmd.gpu_indices)))
    argv = [runtime.path, "run", "--rm", "--init", "--name", name,
            # Rendezvous and NCCL of multi-node jobs use the node's addresses, as outside a container.
            "--network=host", f"--shm-size={SHM_SIZE}"]
    if cmd.gpu_indices:
        # The devices as the runner named them outside: indices, or UUIDs where indices are not
        # the driver's (MIG); docker's --gpus and CDI take either.
        named = job_env.get("CUDA_VISIBLE_DEVICES") or ",".join(str(index) for index in cmd.gpu_indices)
        if runtime.name == "docker":
            # The quotes are part of the value: docker reads --gpus as CSV, where "0,1" is one field.
            argv += ["--gpus", f'"device={named}"']
        else:
            for device in named.split(","):
                argv += ["--device", f"nvidia.com/gpu={device}"]  # CDI, as nvidia-ctk generates it
    argv += ["-v", f"{start_dir}:{start_dir}", "-w", start_dir]
    for path in read_only:
        argv += ["-v", f"{path}:{path}:ro"]
    if account is not None:
        argv += ["--user", f"{account.uid}:{account.gid}"]
        for gid in account.groups:
            if gid != account.gid:
                argv += ["--group-add", str(gid)]
    for variable in inside:
        argv += ["-e", variable]  # the value comes from the client's environment
    argv += [cmd.image, *cmd.argv]
    # The client's own HOME (its config and registry credentials) and PATH (credential helpers)
    # are the account's; what the container sees is ``inside``, passed by name.
    env = {**job_env, **inside}
    # Stopping: docker/podman ``run`` proxies the signals it receives to the container (the
    # default --sig-proxy), and --init forwards them to the job, so the launch's stop signal
    # reaches it. SIGKILL cannot be proxied: a killed client leaves the container running under
    # the daemon, so the supervisor removes it by name once the client is gone (``cleanup``).
    return ContainerLaunch(argv=argv, env=env, cleanup=[runtime.path, "rm", "-f", name])


def _apptainer(runtime, cmd, job_env, inside, start_dir, read_only) -> ContainerLaunch:
    argv = [runtime.path, "exec", "--cleanenv"]
    if cmd.gpu_indices:
        argv.append("--nv")
    argv += ["--pwd", start_dir, "--bind", start_dir]
    for path in read_only:
        argv += ["--bind", f"{path}:{path}:ro"]
    # An image file on the node (a .sif path) as it is; a registry name through apptainer's docker://.
    image = cmd.image if "://" in cmd.image or cmd.image.startswith("/") else f"docker://{cmd.image}"
    argv += [image, *cmd.argv]
    # --cleanenv: the container gets APPTAINERENV_* and nothing else of the client's environment.
    env = {name: job_env[name] for name in HOST_ONLY_ENV if name in job_env}
    env.update({f"APPTAINERENV_{name}": value for name, value in inside.items()})
    # Its processes run in the job's process group, so the group's signals (and SIGKILL) reach them.
    return ContainerLaunch(argv=argv, env=env, cleanup=None)
