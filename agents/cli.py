"""Command line of the node agent: parse arguments, pick a backend, run until SIGTERM/SIGINT.

    python -m agents --node gpu-01 --simulate 8xA100-80GB --redis redis://127.0.0.1:6379/0
    python -m agents --node gpu-01 --run-as colony-jobs --run-as-tenant vision=colony-vision
    python -m agents --node gpu-01 --key-file /etc/colony/agent.key --redis-file /etc/colony/redis-url

Authentication: the node's key (``manage.py agent_key NODE`` on the control plane) comes from
``--key-file``, else ``$COLONY_AGENT_KEY_FILE``, else ``$COLONY_AGENT_KEY``; the agent signs every
message with it. Without a key messages go unsigned (a control plane that requires agent
authentication dead-letters them). A Redis URL with a password (``manage.py agent_acl NODE --url``)
belongs in a file only the agent's account can read (``--redis-file``, ``$COLONY_REDIS_URL_FILE``):
never on the command line, which any local user (jobs included) can read, and better not in the
environment either, which stays in ``/proc/<pid>/environ`` even after the agent removes it.

The agent makes itself non-dumpable first thing (:func:`agents.hardening.make_non_dumpable`), so
a job running under the agent's own account cannot ptrace it or read its memory or environment.

Job sandbox options (each also read from an environment variable, see ``--help``): the account
jobs run as (their researcher's own: ``--user-accounts``, ``--account-map``, ``--min-user-uid``;
fallbacks ``--run-as``, ``--run-as-tenant``; an agent running as root refuses jobs it has no
account for unless ``--allow-root-jobs``), the agent variables jobs inherit (``--pass-env``), the
directories on their PATH (``--job-path``), the variables that change who a job is that a job may
set after all (``--allow-job-env``) and the size bound of each job's output log (``--max-log-bytes``).

``--container-runtime docker|podman|apptainer`` lets the node run jobs that name an ``image``
(:mod:`agents.containers`); the agent refuses to start when that runtime's client is not on its
PATH, and advertises the runtime when it registers, so the scheduler places image jobs only here.

``--isolation auto|mps|memory-limit|none`` chooses how jobs sharing a GPU are fenced, per GPU
(:mod:`agents.isolation`): auto picks driver memory limits where the driver has them and jobs get
a cgroup of their own, else CUDA MPS where ``nvidia-cuda-mps-control`` is there and all jobs run
under one account, else nothing ("unfenced"); MIG instances are fenced by the hardware.
A mode named explicitly that the node cannot give stops the agent from starting (status 1).
``--mps-account NAME`` runs the MPS control daemons under an account no job runs as, so a job
cannot quit them; ``--mps-limits threads=50,memory=20GiB`` sets the MPS servers' own defaults.

Exit status: 0 after a clean shutdown on SIGTERM/SIGINT, 2 for bad arguments, 1 when the chosen
GPU backend cannot run here, 78 (EX_CONFIG) when Redis refuses the node's login or ACL rights (a
Redis that cannot be reached is retried, with back-off, for as long as it takes).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import signal
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agents import __version__, host, protocol, signing, units
from agents.protocol import IDENTITY_ENV, LOADER_ENV_PREFIX
from agents.accounts import (
    DEFAULT_MIN_USER_UID,
    DEFAULT_PASS_ENV,
    JOB_PATH,
    USER_ACCOUNT_MODES,
    RunAsPolicy,
    parse_tenant_accounts,
    read_account_map,
)
from agents.agent import COMMAND_MAX_AGE_S, Agent, CredentialsRefused
from agents.backends import nvml
from agents.backends.base import BackendUnavailable, GpuBackend
from agents.backends.simulated import SimulatedBackend
from agents.containers import RUNTIMES, find_runtime
from agents.hardening import make_non_dumpable
from agents.isolation import FLAGS as ISOLATION_FLAGS, IsolationUnavailable, configure as configure_isolation
from agents.isolation.choose import job_accounts
from agents.joblog import DEFAULT_MAX_LOG_BYTES, MIN_MAX_LOG_BYTES
from agents.runner import JobRunner

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# sysexits' EX_CONFIG: Redis refused the node's login or rights. Restarting cannot fix that, so
# the systemd unit (agents/systemd/) lists it in RestartPreventExitStatus and the unit stays failed.
EXIT_CREDENTIALS_REFUSED = 78
log = logging.getLogger("agents")


def default_redis_url() -> str:
    """``$COLONY_REDIS_URL``, else ``$REDIS_URL``, else the local default (the URL files are read
    by :func:`parse_args`)."""
    return os.environ.get("COLONY_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def read_redis_url_file(path: Path) -> tuple[str, str]:
    """The Redis URL in ``path`` and a warning for the operator ("" if none); ValueError if unreadable."""
    try:
        text = path.read_text().strip()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ValueError(f"cannot read the Redis URL file {path}: {exc.strerror}") from None
    if not text:
        raise ValueError(f"the Redis URL file {path} is empty")
    warning = f"Redis URL file {path} is readable by other users; chmod 600 it" if mode & 0o077 else ""
    return text, warning


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for help texts and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def load_key(key_file: Path | None) -> tuple[bytes | None, str]:
    """The node key from ``key_file``, ``$COLONY_AGENT_KEY_FILE`` or ``$COLONY_AGENT_KEY`` (None: no
    key), and a warning for the operator ("" if none).

    The variables are removed from this process's environment once read, so that nothing the
    agent starts could inherit them. Raises ValueError with a message for the operator.
    """
    env_file = os.environ.pop("COLONY_AGENT_KEY_FILE", "").strip()
    env_key = os.environ.pop("COLONY_AGENT_KEY", "").strip()
    path = key_file or (Path(env_file) if env_file else None)
    if path is not None:
        try:
            text = path.read_text()
            mode = path.stat().st_mode
        except OSError as exc:
            raise ValueError(f"cannot read the agent key file {path}: {exc.strerror}") from None
        warning = f"agent key file {path} is readable by other users; chmod 600 it" if mode & 0o077 else ""
        source = str(path)
    elif env_key:
        text, source, warning = env_key, "$COLONY_AGENT_KEY", ""
    else:
        return None, ""
    try:
        return signing.parse_key(text), warning
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _node_name(value: str) -> str:
    if not protocol.NODE_NAME_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"invalid node name {value!r}: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _non_negative_float(value: str) -> float:
    number = _positive_float(value) if value.strip() not in ("0", "0.0") else 0.0
    return number


def _size_mib(value: str) -> int:
    """``480GiB``, ``512MiB``. A bare number is refused, not read: it meant MiB here, and the same
    number in GiB (what ``colony submit --memory 20`` means) would offer 1024 times the memory."""
    try:
        return units.parse_size(value, bare=None)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return number


def _size(value: str) -> int:
    """``16M``, ``512K``, ``1G`` or a bare number of bytes, as the flag's name (and the environment
    variable's, which operators set) says."""
    try:
        size = units.parse_size(value, "B", bare="B")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if size < MIN_MAX_LOG_BYTES:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_MAX_LOG_BYTES // 1024}K, got {value!r}")
    return size


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _env_list(name: str) -> list[str]:
    value = os.environ.get(name, "").strip()
    return [value] if value else []


# ``--mps-limits`` names -> the MPS control command that sets that server-side default. Each
# daemon sees one GPU (its ``CUDA_VISIBLE_DEVICES``), so the pinned memory limit is device 0's.
MPS_LIMITS = {"threads": "set_default_active_thread_percentage", "memory": "set_default_device_pinned_mem_limit"}


def parse_mps_limits(values: list[str]) -> dict[str, str]:
    """``threads=50,memory=20GiB`` -> the MPS control commands that set them as each server's
    defaults (the most a client gets whatever its own variables say); ValueError says what is wrong."""
    limits: dict[str, str] = {}
    for item in filter(None, (part.strip() for value in values for part in value.split(","))):
        name, sep, value = (word.strip() for word in item.partition("="))
        if not sep or name not in MPS_LIMITS:
            raise ValueError(f"{item!r}: expected threads=PERCENT or memory=SIZE")
        if name == "threads":
            if not value.isdigit() or not 1 <= int(value) <= 100:
                raise ValueError(f"threads={value}: a whole percentage of the GPU's SMs, 1 to 100")
            limits[MPS_LIMITS[name]] = str(int(value))
        else:
            mib = units.parse_size(value, bare=None)
            if mib <= 0:
                raise ValueError(f"memory={value}: must be more than nothing")
            limits[MPS_LIMITS[name]] = f"0 {mib}M"
    return limits


def mps_service_account(name: str, policy: RunAsPolicy) -> tuple[int, int]:
    """The (uid, gid) of ``--mps-account``: an account no job runs as, which is what keeps jobs
    from quitting the daemon (MPS takes control commands from the daemon's uid and root only).
    ValueError when it is unknown, root, an account jobs run as, or one the agent cannot switch to."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"no account {name!r} in this node's user database") from None
    if entry.pw_uid == 0:
        raise ValueError(f"{name!r} is root; name an account of its own that no job runs as, e.g. colony-mps")
    if not policy.switches_users:
        raise ValueError("the agent is not root, so it cannot run the MPS daemon as another account")
    uids, _owner = job_accounts(policy)
    if entry.pw_uid in uids:
        raise ValueError(f"jobs run as {name!r} (--run-as / --run-as-tenant), so they could quit its daemon")
    mapped = {spec.partition(":")[0] for spec in policy.user_map.values()}
    by_name = policy.user_accounts == "nss" and entry.pw_uid >= policy.min_user_uid
    if policy.maps_users and (name in mapped or by_name):
        raise ValueError(f"a researcher's jobs could run as {name!r} (it is in --account-map, or a user account "
                         f"at or above --min-user-uid {policy.min_user_uid}); use a system account no one maps to")
    return entry.pw_uid, entry.pw_gid


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agents",
        description="Colony node agent.",
        epilog=(
            "Jobs run without a shell, in their own directory under --workdir, with an environment "
            "built from an allow-list (never the agent's whole environment). When the agent runs as "
            "root, each job drops to its researcher's own account (--user-accounts, --account-map), else "
            "to the account --run-as-tenant maps its tenant to, else to --run-as; with none, launches are "
            "refused (reported as failed to start) unless --allow-root-jobs. "
            "An agent that is not root runs jobs as its own user and rejects accounts naming anyone else."
        ),
    )
    parser.add_argument("--node", required=True, type=_node_name, help="this node's name in the cluster")
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        help="simulate GPUs instead of using NVML, e.g. 8xA100-80GB or 4xV100-32GB,4xT4-16GB",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "nvml", "simulated"),
        default="auto",
        help="auto (default): NVML when it finds a GPU, or simulated when --simulate is given",
    )
    parser.add_argument(
        "--redis",
        default=default_redis_url(),
        metavar="URL",
        help="Redis URL, redis://USER:PASSWORD@HOST:PORT/DB for a per-node ACL user (default: "
        f"$COLONY_REDIS_URL, else $REDIS_URL, else {DEFAULT_REDIS_URL}; now {redacted_url(default_redis_url())})",
    )
    parser.add_argument(
        "--redis-file",
        type=Path,
        metavar="PATH",
        help="read the Redis URL from this file (mode 600), for a URL with a password; default "
        "$COLONY_REDIS_URL_FILE. Takes precedence over --redis",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        metavar="PATH",
        help="this node's signing key (64 hex digits, from `manage.py agent_key NODE`); default "
        "$COLONY_AGENT_KEY_FILE, else the key itself in $COLONY_AGENT_KEY; without one, messages are unsigned",
    )
    parser.add_argument("--interval", type=_positive_float, default=1.0, help="seconds per loop (default 1.0)")
    parser.add_argument(
        "--heartbeat-ttl", type=_positive_float, default=10.0, help="heartbeat key TTL in seconds (default 10)"
    )
    parser.add_argument(
        "--duty-period",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="time-slicing period of throttled jobs: one run and one stop per period (default 1.0)",
    )
    parser.add_argument(
        "--command-max-age",
        type=_positive_float,
        default=COMMAND_MAX_AGE_S,
        metavar="SECONDS",
        help="refuse a signed command issued longer ago than this (default 300); keep node clocks in sync",
    )
    parser.add_argument("--workdir", type=Path, help="job directories and logs (default var/agent/<node>)")
    offered = parser.add_argument_group(
        "CPU and host memory offered to jobs (the scheduler never places more requested there)")
    offered.add_argument("--cpus", type=_positive_float, metavar="N",
                         help="CPU cores to offer (default: the cores this agent may run on, less --reserve-cpus)")
    offered.add_argument("--reserve-cpus", type=_non_negative_float, default=1.0, metavar="N",
                         help="cores kept for the system when --cpus is not given (default 1)")
    offered.add_argument("--host-memory", type=_size_mib, metavar="SIZE",
                         help="host memory to offer, with its unit, e.g. 480GiB "
                              "(default: MemTotal less --reserve-host-memory)")
    offered.add_argument("--reserve-host-memory", type=_size_mib, default=4096, metavar="SIZE",
                         help="memory kept for the system when --host-memory is not given (default 4GiB)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sandbox = parser.add_argument_group("job sandbox")
    sandbox.add_argument(
        "--run-as",
        metavar="USER[:GROUP]",
        default=os.environ.get("COLONY_AGENT_RUN_AS") or None,
        help="unprivileged local account jobs run as when the agent is root (supplementary groups "
        "from the group database); default $COLONY_AGENT_RUN_AS",
    )
    sandbox.add_argument(
        "--run-as-tenant",
        metavar="TENANT=USER[:GROUP],...",
        action="append",
        help="account per tenant slug, e.g. vision=colony-vision,nlp=colony-nlp (repeatable); "
        "tenants not listed fall back to --run-as; default $COLONY_AGENT_RUN_AS_TENANT",
    )
    sandbox.add_argument(
        "--user-accounts",
        choices=USER_ACCOUNT_MODES,
        default=os.environ.get("COLONY_AGENT_USER_ACCOUNTS") or "nss",
        help="how a job's submitter maps to the account it runs as, when the agent is root: nss (default): "
        "the --account-map entry, else the account of the same name (or the identity provider's POSIX "
        "name) through NSS/LDAP, at or above --min-user-uid; map: the --account-map entry only; off: "
        "--run-as / --run-as-tenant for every job. Default $COLONY_AGENT_USER_ACCOUNTS",
    )
    sandbox.add_argument(
        "--account-map",
        type=Path,
        metavar="PATH",
        default=os.environ.get("COLONY_AGENT_ACCOUNT_MAP") or None,
        help="file of lines 'COLONY_USER POSIX_ACCOUNT[:GROUP]' (read at start) mapping Colony users to "
        "local accounts; default $COLONY_AGENT_ACCOUNT_MAP",
    )
    sandbox.add_argument(
        "--min-user-uid",
        type=int,
        metavar="UID",
        default=int(os.environ.get("COLONY_AGENT_MIN_USER_UID") or DEFAULT_MIN_USER_UID),
        help=f"lowest uid a name found through NSS may run a job as (default {DEFAULT_MIN_USER_UID}, "
        "$COLONY_AGENT_MIN_USER_UID): below are system accounts. The account map may name any but root",
    )
    sandbox.add_argument(
        "--allow-root-jobs",
        action="store_true",
        default=_env_flag("COLONY_AGENT_ALLOW_ROOT_JOBS"),
        help="let an agent running as root run jobs that have no --run-as account as root. For a "
        "local demo or CI only, never on a shared cluster; default $COLONY_AGENT_ALLOW_ROOT_JOBS=1",
    )
    sandbox.add_argument(
        "--pass-env",
        metavar="NAME,...",
        action="append",
        help="agent environment variables jobs inherit, besides " + ", ".join(DEFAULT_PASS_ENV)
        + "; shell patterns like NCCL_* allowed (repeatable); default $COLONY_AGENT_PASS_ENV. "
        "The Redis URL is never passed",
    )
    sandbox.add_argument(
        "--job-path",
        metavar="DIR:DIR",
        action="append",
        help="directories put before " + ":".join(JOB_PATH) + " on every job's PATH, e.g. "
        "/usr/local/cuda/bin (repeatable); jobs never get the agent's own PATH; default $COLONY_AGENT_JOB_PATH",
    )
    sandbox.add_argument(
        "--allow-job-env",
        metavar="NAME,...",
        action="append",
        help="variables a job's spec may set although they change who it is or what runs in it (refused "
        "otherwise: " + ", ".join(IDENTITY_ENV) + f", {LOADER_ENV_PREFIX}*), e.g. LD_LIBRARY_PATH "
        "(repeatable); default $COLONY_AGENT_ALLOW_JOB_ENV",
    )
    sandbox.add_argument(
        "--max-log-bytes",
        metavar="SIZE",
        type=_size,
        default=os.environ.get("COLONY_AGENT_MAX_LOG_BYTES") or str(DEFAULT_MAX_LOG_BYTES),
        help="bound on each job's output.log, e.g. 16M (default $COLONY_AGENT_MAX_LOG_BYTES, else 16M); "
        "past it the log keeps its first eighth and the most recent output, and the job goes on",
    )
    sandbox.add_argument(
        "--container-runtime",
        choices=RUNTIMES,
        default=os.environ.get("COLONY_AGENT_CONTAINER_RUNTIME") or None,
        help="run jobs that name an image with this runtime (its client must be on PATH); without it, "
        "image jobs are refused; default $COLONY_AGENT_CONTAINER_RUNTIME",
    )
    fencing = parser.add_argument_group("isolation of jobs that share a GPU")
    fencing.add_argument(
        "--isolation",
        choices=ISOLATION_FLAGS,
        default=os.environ.get("COLONY_AGENT_ISOLATION") or "auto",
        help="auto (default): per GPU, driver memory limits if the driver has them, else CUDA MPS if "
        "nvidia-cuda-mps-control is there and all jobs run under one account, else none; "
        "mps / memory-limit: that mode on every GPU or refuse to start; none: nothing enforced. "
        "Default $COLONY_AGENT_ISOLATION",
    )
    fencing.add_argument(
        "--mps-control",
        type=Path,
        metavar="PATH",
        default=os.environ.get("COLONY_AGENT_MPS_CONTROL") or None,
        help="the nvidia-cuda-mps-control binary (default: found on PATH); default $COLONY_AGENT_MPS_CONTROL",
    )
    fencing.add_argument(
        "--mps-account",
        metavar="NAME",
        default=os.environ.get("COLONY_AGENT_MPS_ACCOUNT") or None,
        help="run the MPS control daemons as this account, one no job runs as (e.g. colony-mps): jobs are "
        "then only clients, and cannot quit a daemon or start their own, and MPS GPUs are put in "
        "EXCLUSIVE_PROCESS compute mode. Without it the daemon runs as the jobs' account (fences cooperating "
        "jobs only). Default $COLONY_AGENT_MPS_ACCOUNT",
    )
    fencing.add_argument(
        "--mps-limits",
        metavar="threads=PERCENT,memory=SIZE",
        action="append",
        help="MPS server-side defaults set at each daemon's start, the most a client gets whatever its own "
        "variables say: threads (percent of the SMs), memory (pinned GPU memory, e.g. 20GiB); "
        "default $COLONY_AGENT_MPS_LIMITS",
    )
    fencing.add_argument(
        "--cgroup-root",
        type=Path,
        metavar="PATH",
        default=os.environ.get("COLONY_AGENT_CGROUP_ROOT") or None,
        help="cgroup v2 directory, delegated to the agent, that jobs' cgroups are made in (default: the "
        "agent's own cgroup, e.g. with Delegate=yes in its systemd unit); default $COLONY_AGENT_CGROUP_ROOT",
    )
    parser.add_argument("--version", action="version", version=f"colony-agent {__version__}")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the arguments; exits with status 2 on any mistake."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.simulate is not None:
        if args.backend == "nvml":
            parser.error("--simulate cannot be combined with --backend nvml")
        args.backend = "simulated"
        try:
            SimulatedBackend(args.simulate, args.node)
        except ValueError as exc:
            parser.error(f"--simulate: {exc}")
    elif args.backend == "simulated":
        parser.error("--backend simulated needs --simulate SPEC, e.g. --simulate 8xA100-80GB")
    redis_file = args.redis_file or (Path(os.environ["COLONY_REDIS_URL_FILE"])
                                     if os.environ.get("COLONY_REDIS_URL_FILE") else None)
    os.environ.pop("COLONY_REDIS_URL_FILE", None)
    args.redis_warning = ""
    if redis_file is not None:
        try:
            args.redis, args.redis_warning = read_redis_url_file(redis_file)
        except ValueError as exc:
            parser.error(f"--redis-file: {exc}")
    if urlsplit(args.redis).scheme not in ("redis", "rediss", "unix"):
        parser.error(f"--redis: expected a redis://, rediss:// or unix:// URL, got {redacted_url(args.redis)!r}")
    if args.heartbeat_ttl <= args.interval:
        parser.error("--heartbeat-ttl must be longer than --interval, or the heartbeat lapses between refreshes")
    try:
        args.key, args.key_warning = load_key(args.key_file)
    except ValueError as exc:
        parser.error(str(exc))
    if args.workdir is None:
        args.workdir = Path("var") / "agent" / args.node
    args.workdir = args.workdir.resolve()
    if args.user_accounts not in USER_ACCOUNT_MODES:  # from $COLONY_AGENT_USER_ACCOUNTS, which argparse does not check
        parser.error(f"--user-accounts: expected one of {', '.join(USER_ACCOUNT_MODES)}, got {args.user_accounts!r}")
    user_map = {}
    if args.account_map is not None:
        try:
            user_map = read_account_map(args.account_map)
        except ValueError as exc:
            parser.error(f"--account-map: {exc}")
    try:
        tenant_accounts = parse_tenant_accounts(args.run_as_tenant or _env_list("COLONY_AGENT_RUN_AS_TENANT"))
        args.run_as_policy = RunAsPolicy.configure(
            args.run_as, tenant_accounts, allow_root=args.allow_root_jobs, user_accounts=args.user_accounts,
            user_map=user_map, min_user_uid=args.min_user_uid,
        )
    except ValueError as exc:
        parser.error(str(exc) if str(exc).startswith("--") else f"--run-as-tenant: {exc}")
    args.job_path = tuple(
        directory.strip()
        for value in (args.job_path or _env_list("COLONY_AGENT_JOB_PATH"))
        for directory in value.split(":")
        if directory.strip()
    )
    relative = [directory for directory in args.job_path if not directory.startswith("/")]
    if relative:
        parser.error(f"--job-path: directories must be absolute, got {relative[0]!r}")
    args.allowed_env = tuple(
        name.strip()
        for value in (args.allow_job_env or _env_list("COLONY_AGENT_ALLOW_JOB_ENV"))
        for name in value.split(",")
        if name.strip()
    )
    if args.isolation not in ISOLATION_FLAGS:  # from $COLONY_AGENT_ISOLATION, which argparse does not check
        parser.error(f"--isolation: expected one of {', '.join(ISOLATION_FLAGS)}, got {args.isolation!r}")
    args.mps_service = None
    if args.mps_account:
        try:
            args.mps_service = mps_service_account(args.mps_account, args.run_as_policy)
        except ValueError as exc:
            parser.error(f"--mps-account {args.mps_account}: {exc}")
    try:
        args.mps_server_limits = parse_mps_limits(args.mps_limits or _env_list("COLONY_AGENT_MPS_LIMITS"))
    except ValueError as exc:
        parser.error(f"--mps-limits: {exc}")
    args.runtime = None
    if args.container_runtime:
        try:
            args.runtime = find_runtime(args.container_runtime)
        except ValueError as exc:
            parser.error(f"--container-runtime: {exc}")
    args.pass_env = DEFAULT_PASS_ENV + tuple(
        name.strip()
        for value in (args.pass_env or _env_list("COLONY_AGENT_PASS_ENV"))
        for name in value.split(",")
        if name.strip()
    )
    return args


def job_fences(policy: RunAsPolicy, isolation) -> tuple[tuple[str, ...], list[str]]:
    """What fences every job on this node (:data:`agents.protocol.JOB_FENCES`), as the isolation
    layer found them (:attr:`~agents.isolation.IsolationLayer.fencing`) and the accounts policy
    says, and one warning for the operator per fence it lacks."""
    fencing = isolation.fencing
    fences = list(fencing.kinds)
    why = f" ({'; '.join(fencing.reasons)})" if fencing.reasons else ""
    warnings: list[str] = []
    if not fencing.cgroups:
        warnings.append(f"jobs get no cgroup of their own{why}: what a job starts can outlive it; "
                        "the node is shown as unfenced")
    elif not fencing.devices:
        warnings.append(f"no device filter{why}: a job that unsets CUDA_VISIBLE_DEVICES can open every GPU of "
                        "the node; the node is shown as unfenced")
    if policy.maps_users:
        fences.append("accounts")
    elif policy.switches_users:
        warnings.append("jobs do not run as their researchers (--user-accounts off): jobs sharing an account "
                        "can signal each other and read each other's files")
    else:
        warnings.append("the agent is not root, so every job runs as the agent's own account, not its researcher's")
    return tuple(fences), warnings


def make_backend(args: argparse.Namespace) -> GpuBackend:
    """The backend the arguments ask for; raises BackendUnavailable with a message for the operator."""
    if args.backend == "simulated":
        return SimulatedBackend(args.simulate, args.node)
    if args.backend == "auto" and not nvml.available():
        raise BackendUnavailable(
            "no NVIDIA GPU found through NVML (is the driver loaded and nvidia-ml-py installed?); "
            "pass --simulate SPEC to run with simulated GPUs"
        )
    return nvml.NvmlBackend(args.node)


def main(argv: list[str] | None = None) -> int:
    # Before reading any secret: no job (even one under the agent's own account) may ptrace this
    # process or read its memory or /proc/<pid>/environ.
    non_dumpable = make_non_dumpable()
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        # The node name is validated to [A-Za-z0-9._-], so it is safe inside a format string.
        format=f"%(asctime)s {args.node} %(levelname)s %(name)s: %(message)s",
    )
    try:
        backend = make_backend(args)
    except BackendUnavailable as exc:
        log.error("%s", exc)
        return 1
    try:
        isolation = configure_isolation(
            args.isolation, backend.inventory(), backend=backend, run_as=args.run_as_policy,
            state_dir=args.workdir / "isolation", mps_control=args.mps_control, cgroup_root=args.cgroup_root,
            mps_service=args.mps_service, mps_server_limits=args.mps_server_limits,
        )
    except IsolationUnavailable as exc:
        log.error("%s", exc)
        backend.close()
        return 1
    policy: RunAsPolicy = args.run_as_policy
    if policy.switches_users and not policy.maps_users and policy.default is None and not policy.tenants \
            and not policy.allow_root:
        log.warning("%s", policy.describe())
    else:
        log.info("%s", policy.describe())
    fences, missing = job_fences(policy, isolation)
    log.info("job fences on this node: %s", ", ".join(fences) or "none")
    for warning in missing:
        log.warning("%s", warning)
    if not non_dumpable and sys.platform.startswith("linux"):
        log.warning("could not make the agent non-dumpable (prctl failed): "
                    "jobs under its account could read its memory")
    for warning in (args.key_warning, args.redis_warning):
        if warning:
            log.warning("%s", warning)
    if args.key is None:
        log.warning("no agent key (--key-file, $COLONY_AGENT_KEY_FILE or $COLONY_AGENT_KEY): messages are "
                    "unsigned, and a control plane that requires agent authentication rejects them")
    else:
        log.info("signing messages with this node's key")
    if args.runtime is not None:
        log.info("image jobs run with %s (%s)", args.runtime.name, args.runtime.path)

    stop = threading.Event()

    def request_stop(signum, _frame):
        if stop.is_set():
            log.info("already stopping")
            return
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        agent = Agent(
            args.node,
            backend,
            args.redis,
            JobRunner(
                args.workdir,
                duty_period=args.duty_period,
                run_as=policy,
                max_log_bytes=args.max_log_bytes,
                pass_env=args.pass_env,
                container_runtime=args.runtime,
                node=args.node,
                isolation=isolation,
                job_path=args.job_path,
                allowed_env=args.allowed_env,
            ),
            interval=args.interval,
            heartbeat_ttl=args.heartbeat_ttl,
            key=args.key,
            command_max_age=args.command_max_age,
            host=host.offer(args.cpus, args.host_memory, args.reserve_cpus, args.reserve_host_memory),
            job_fences=fences,
        )
        agent.run(stop)
    except CredentialsRefused as exc:
        # One line, last on stderr, for `systemctl status` and the journal.
        log.critical("%s (at %s); check the node's Redis URL file and its ACL user "
                     "(`manage.py agent_acl %s`); not retrying", exc, redacted_url(args.redis), args.node)
        return EXIT_CREDENTIALS_REFUSED
    finally:
        isolation.close()  # after a crash too: no MPS daemon outlives its agent
        backend.close()
    return 0
