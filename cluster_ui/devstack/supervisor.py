"""``python -m cluster_ui.devstack``: the whole of Colony on one machine, on embedded defaults.

Starts a private Redis, migrates and seeds the database (SQLite unless ``DATABASE_URL`` says
otherwise), then a Celery worker, the scheduler (a Celery worker of one process for the
``scheduler`` queue), Celery beat, a metrics ingest reader, one simulated agent per node and the
web server.

Supervision: a child that dies (worker, beat, ingest, an agent, the web server, Redis) is started
again after a backoff (1 s, doubling to 30 s; back to 1 s once it has stayed up a minute), and the
output says so; the rest of the stack runs on. Ctrl-C (or SIGTERM) stops every child, newest
first, and leaves no orphan: each child runs in its own process group, which is signalled as a
whole, and also gets SIGTERM if this process dies.

Secrets: agents authenticate as in production (a random ``COLONY_AGENT_SECRET`` for the run unless
one is set; each agent holds only its own key), Redis requires a password, and with Redis >= 7
each agent logs in as its own ACL user (:func:`agents.signing.redis_acl_rules`). Every secret
(agent secret, Django secret key, Redis URLs with their passwords, each node's key, a
``DATABASE_URL``) is written to a file of mode 600 under ``<var>/secrets`` (mode 700), and children
get only the paths (``*_FILE``, ``--key-file``, ``--redis-file``): no secret is in the environment
or on the command line of any process, where a job could read it from ``/proc``. Every process
that reads one makes itself non-dumpable (:mod:`agents.hardening`).

Run as root, the agents run each researcher's jobs under their own local account
(``colony-u-<user>``, created when missing and listed in an account map the agents read), and a
user made later under their tenant's account (``colony-<tenant>``, or ``colony-jobs``), never as
root, so jobs of different people cannot signal each other or read each other's files, nor
anything of the stack's. Not root, jobs run as the user who started the stack, which it says.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agents import signing
from agents.hardening import make_non_dumpable
from cluster_ui.devstack.redis_server import (
    PrivateRedis,
    free_port,
    redis_server_binary,
    redis_server_version,
    supports_acl_selectors,
)

BASE_DIR = Path(__file__).resolve().parents[2]
# The second node's last A100 is split into MIG instances, so the demo shows them (node page, submit form).
DEFAULT_NODES = ["8xA100-80GB", "7xA100-80GB,1xA100-80GB[mig=2x1g.10gb,2g.20gb,3g.40gb]", "8xV100-32GB"]
PR_SET_PDEATHSIG = 1
# Backoff of restarts: first delay, cap, and how long a child must stay up to be forgiven.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_AFTER_S = 60.0
# The account of jobs whose tenant has none of its own (a tenant created after the stack started).
DEFAULT_JOB_ACCOUNT = "colony-jobs"
# settings.COLONY_SCHEDULER_QUEUE (this process does not load Django's settings).
SCHEDULER_QUEUE = "scheduler"
# Every worker runs without mingle, gossip and worker heartbeats (docker-compose.yml's and the e2e
# stack's too): they are Celery's worker-to-worker chatter, which Colony does not use (the
# scheduler's lease lives in the database), and with a Redis broker they are what a worker trips on
# when Redis restarts. A devstack worker started with them logged kombu's AttributeError while
# closing a consumer step's channel against a Redis that refused connections, then took no task for
# 90 s while beat kept sending them (once in about a dozen runs of the devstack test; celery#8030
# and #9054 report the same, and this is their workaround). Remote control, which the compose
# healthcheck's ``inspect ping`` uses, stays.
QUIET_WORKER = ("--without-mingle", "--without-gossip", "--without-heartbeat")
# Variables that could carry a secret: never passed to a child (they get the *_FILE path instead).
SECRET_VARS = ("COLONY_AGENT_SECRET", "DJANGO_SECRET_KEY", "REDIS_URL", "CELERY_BROKER_URL", "COLONY_CACHE_URL",
               "COLONY_REDIS_URL", "DATABASE_URL", "COLONY_AGENT_KEY", "COLONY_METRICS_TOKEN")


def _die_with_parent() -> None:
    # Linux only; elsewhere the process-group shutdown below still applies.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _private_child() -> None:
    """Server processes create their files (SQLite database, beat schedule) for their owner only."""
    _die_with_parent()
    os.umask(0o077)


@dataclass
class Child:
    name: str
    spawn: Callable[[], subprocess.Popen]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    #: restarts since it last stayed up RESTART_RESET_AFTER_S (the backoff's exponent)
    failures: int = 0
    restart_at: float | None = None
    log: Path | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


class Supervisor:
    def __init__(self, var_dir: Path, env: dict[str, str], *, out=None, first_delay: float = RESTART_FIRST_S,
                 max_delay: float = RESTART_MAX_S, reset_after: float = RESTART_RESET_AFTER_S):
        self.log_dir = var_dir / "log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.log_dir, 0o700)
        self.env = env
        self.children: list[Child] = []
        self.out = out or sys.stdout
        self.first_delay, self.max_delay, self.reset_after = first_delay, max_delay, reset_after

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, *, private: bool = True) -> Child:
        log_path = self.log_dir / f"{name}.log"
        child_env = self.env if env is None else env

        def spawn() -> subprocess.Popen:
            with open(log_path, "ab") as log:
                return subprocess.Popen(
                    argv, cwd=BASE_DIR, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    preexec_fn=_private_child if private else _die_with_parent,
                )

        return self.adopt(name, spawn, log=log_path)

    def adopt(self, name: str, spawn: Callable[[], subprocess.Popen], log: Path | None = None,
              running: subprocess.Popen | None = None) -> Child:
        """Supervise what ``spawn`` starts: now (unless ``running`` is it already), and after each death."""
        child = Child(name, spawn, log=log)
        if running is None:
            self._spawn(child)
        else:
            child.process, child.started_at = running, time.monotonic()
        self.children.append(child)
        return child

    def _spawn(self, child: Child) -> None:
        child.process, child.started_at, child.restart_at = child.spawn(), time.monotonic(), None

    def poll(self) -> None:
        """Notice dead children and restart those whose backoff has run out; call it often."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is None and child.process.poll() is not None:
                # What the child left in its group (a Celery pool process, say) goes with it.
                _signal_group(child.process, signal.SIGKILL)
                if now - child.started_at >= self.reset_after:
                    child.failures = 0
                delay = min(self.max_delay, self.first_delay * 2 ** child.failures)
                child.failures += 1
                child.restarts += 1
                child.restart_at = now + delay
                where = f"; see {child.log}" if child.log else ""
                self.say(f"{child.name} exited with code {child.process.returncode}; restarting in {delay:g} s "
                         f"(restart {child.restarts}){where}")
            elif child.restart_at is not None and now >= child.restart_at:
                try:
                    self._spawn(child)
                except Exception as exc:  # noqa: BLE001 - try again later, never take the stack down
                    child.restart_at = now + min(self.max_delay, self.first_delay * 2 ** child.failures)
                    child.failures += 1
                    self.say(f"{child.name} could not be started ({exc}); trying again")
                    continue
                self.say(f"{child.name} restarted (pid {child.process.pid})")

    def stop_all(self, grace: float = 10.0) -> None:
        for child in reversed(self.children):
            if child.process is not None:
                _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"  {child.name} did not stop in {grace:.0f}s; killing it")
            # Whatever is left of the group (a Celery pool process, say) goes too.
            _signal_group(child.process, signal.SIGKILL)
            child.process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- secrets in files


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, mode 600 from the start (never briefly readable by others)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def secrets_dir(var_dir: Path) -> Path:
    path = var_dir / "secrets"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _secret_from(env: dict[str, str], name: str) -> str | None:
    """``name``'s value from the developer's environment (or the file ``name_FILE`` names)."""
    if env.get(f"{name}_FILE"):
        return Path(env[f"{name}_FILE"]).read_text().strip()
    return env.get(name) or None


def devstack_settings(env: dict[str, str], python: str, port: int) -> dict[str, str]:
    """What the devstack sets on top of the caller's environment (which wins where it says)."""
    return {
        # Debug off, as a user sees Colony (its own 404 and 500 pages, no settings on an error
        # page); plain http on 127.0.0.1, static files from runserver --insecure.
        "DJANGO_DEBUG": env.get("DJANGO_DEBUG", "0"),
        "COLONY_HTTPS": env.get("COLONY_HTTPS", "0"),
        # Links in notifications (email, webhooks) point where this stack serves, whatever --port.
        "COLONY_PUBLIC_URL": env.get("COLONY_PUBLIC_URL") or f"http://127.0.0.1:{port}",
        "PYTHONUNBUFFERED": "1",
        # Jobs' `python` is this virtualenv's interpreter.
        "PATH": f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}",
    }


def server_environment(base: dict[str, str], files: dict[str, Path]) -> dict[str, str]:
    """The control plane's environment: ``base`` without any secret, plus ``NAME_FILE`` paths."""
    env = {name: value for name, value in base.items()
           if name not in SECRET_VARS and not (name.endswith("_FILE") and name.removesuffix("_FILE") in SECRET_VARS)}
    env.update({f"{name}_FILE": str(path) for name, path in files.items()})
    return env


def agent_environment(server_env: dict[str, str]) -> dict[str, str]:
    """An agent's environment: the server's without any secret path (an agent gets only its own
    key and Redis URL files, by argument)."""
    return {name: value for name, value in server_env.items() if not name.endswith("_FILE")}


# ---------------------------------------------------------------- job accounts (root only)

_ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def tenant_account_name(slug: str) -> str | None:
    name = f"colony-{slug.lower()}"
    return name if _ACCOUNT_RE.match(name) and name != DEFAULT_JOB_ACCOUNT else None


def ensure_account(name: str) -> str | None:
    """Create the local system account ``name`` if missing; None on success, else why not."""
    import pwd

    try:
        pwd.getpwnam(name)
        return None
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        return "useradd is not available"
    made = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
    return None if made.returncode == 0 else f"useradd {name} failed: {made.stderr.strip()}"


def unsearchable_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that other users cannot pass through (None: all can)."""
    for directory in [*reversed(path.resolve().parents)]:
        if not os.stat(directory).st_mode & 0o001:
            return directory
    return None


def jobs_python(python: str, bin_dir: Path) -> tuple[Path | None, str]:
    """Where other accounts find a ``python`` for their jobs: None when this virtualenv's interpreter
    is within their reach (it is first on PATH), else ``bin_dir`` holding links to a system
    ``python3`` they can run; ``(None, why)`` when there is none."""
    blocked = unsearchable_ancestor(Path(python).resolve())
    if blocked is None:
        return None, ""
    venv_bin = str(Path(python).parent)
    system_path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != venv_bin)
    for candidate in (shutil.which("python3", path=system_path), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.access(candidate, os.X_OK) and unsearchable_ancestor(Path(candidate).resolve()) is None:
            bin_dir.mkdir(exist_ok=True)
            os.chmod(bin_dir, 0o755)
            for name in ("python", "python3"):
                link = bin_dir / name
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(Path(candidate).resolve())
            return bin_dir, (f"jobs' python is {Path(candidate).resolve()}: this virtualenv's interpreter is under "
                             f"{blocked}, which other accounts cannot enter")
    return None, f"{blocked} is not searchable by other users, and this virtualenv's interpreter lives there"


def job_accounts(tenants: list[str], agents_root: Path, python_problem: str = "") -> tuple[list[str], str]:
    """Agent arguments that run each tenant's jobs under its own account, and a line saying so.

    Falls back to ``--allow-root-jobs`` (saying why) where accounts cannot be made or could not
    reach their job directories or an interpreter."""
    blocked = unsearchable_ancestor(agents_root)
    if blocked is not None:
        return ["--allow-root-jobs"], (f"Jobs run as ROOT: {blocked} is not searchable by other users, so job "
                                       f"accounts could not reach their directories (chmod o+x it, or set "
                                       f"COLONY_VAR_DIR elsewhere)")
    if python_problem:
        return ["--allow-root-jobs"], f"Jobs run as ROOT: {python_problem}"
    mapping = {slug: name for slug in tenants if (name := tenant_account_name(slug))}
    for name in [DEFAULT_JOB_ACCOUNT, *mapping.values()]:
        problem = ensure_account(name)
        if problem:
            return ["--allow-root-jobs"], f"Jobs run as ROOT: {problem}"
    argv = ["--run-as", DEFAULT_JOB_ACCOUNT]
    if mapping:
        argv += ["--run-as-tenant=" + ",".join(f"{slug}={name}" for slug, name in sorted(mapping.items()))]
    described = ", ".join(f"{slug} as {name}" for slug, name in sorted(mapping.items()))
    return argv, f"Jobs run per tenant under their own accounts ({described}; others as {DEFAULT_JOB_ACCOUNT})"


def user_account_name(username: str) -> str | None:
    """The demo's local account for a Colony user: ``colony-u-<name>`` where that is a valid name."""
    name = f"colony-u-{username.lower()}"
    return name if _ACCOUNT_RE.match(name) else None


def user_accounts(usernames: list[str], agents_root: Path) -> tuple[list[str], str]:
    """Agent arguments that run each researcher's jobs as their own local account (made when
    missing) through an account map, and a line saying so; ``([], why)`` where one cannot be made."""
    mapping = {user: name for user in usernames if (name := user_account_name(user))}
    for name in mapping.values():
        problem = ensure_account(name)
        if problem:
            return [], f"Jobs do not run per user: {problem}"
    account_map = agents_root / "accounts.map"
    account_map.write_text("# Colony user -> the local account their jobs run as (made by the devstack)\n"
                           + "".join(f"{user} {name}\n" for user, name in sorted(mapping.items())))
    os.chmod(account_map, 0o644)
    described = ", ".join(f"{user} as {name}" for user, name in sorted(mapping.items()))
    return ["--account-map", str(account_map)], f"Jobs run as their researchers' own accounts ({described})"


# Migrate, seed the demo and list the tenants (after seeding) in one Django process: each start of
# Django is about a second of the stack's start-up on a small machine, and this used three. The
# password comes on stdin: a command line is readable by every process on the machine.
SET_UP_DATABASE = """
import sys
from django.core.management import call_command
from jobs.models import Tenant
call_command("migrate", interactive=False, verbosity=0)
call_command("seed_demo", password=sys.stdin.readline().rstrip("\\n"))
print("TENANTS", *Tenant.objects.values_list("slug", flat=True), flush=True)
from django.contrib.auth import get_user_model
print("USERS", *get_user_model().objects.values_list("username", flat=True), flush=True)
"""


def set_up_database(python: str, env: dict[str, str], password: str) -> tuple[list[str], list[str]]:
    """Migrate and seed the database; the tenants' slugs and the user names. What the commands say
    is passed on."""
    out = subprocess.run([python, "manage.py", "shell", "-v", "0", "-c", SET_UP_DATABASE], cwd=BASE_DIR, env=env,
                         check=True, input=password + "\n", stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: os.umask(0o077)).stdout
    tenants, users = [], []
    for line in out.splitlines():
        if line.startswith("TENANTS"):
            tenants = line.split()[1:]
        elif line.startswith("USERS"):
            users = line.split()[1:]
        else:
            print(line, flush=True)
    return tenants, users


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cluster_ui.devstack", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="web server port (default 8000)")
    parser.add_argument("--notebook-port", type=int, default=None,
                        help="notebook proxy port (colony jupyter; default: the web port + 1, or any free one)")
    parser.add_argument("--node", action="append", dest="nodes", metavar="SPEC",
                        help="a simulated node's GPUs, e.g. 8xA100-80GB; repeat per node "
                             f"(default: {' '.join(DEFAULT_NODES)})")
    parser.add_argument("--password", default="colony-demo", help="demo users' password")
    parser.add_argument("--jobs-as-root", action="store_true",
                        help="run as root: run jobs as root too instead of per-tenant accounts (never on a "
                             "shared machine)")
    return parser.parse_args(argv)


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def main(argv: list[str] | None = None) -> int:
    make_non_dumpable()  # this process holds every secret of the stack
    args = parse_args(argv)
    python = sys.executable
    var_dir = Path(os.environ.get("COLONY_VAR_DIR", BASE_DIR / "var"))
    if not free_port(args.port) == args.port:
        print(f"Port {args.port} is taken; pass --port to use another.", file=sys.stderr)
        return 2
    var_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(var_dir, 0o711)  # job accounts pass through to their directories; nobody lists it
    for path in var_dir.glob("colony.sqlite3*"):
        os.chmod(path, 0o600)
    secret_dir = secrets_dir(var_dir)
    base = dict(os.environ)

    # Secrets: the developer's own, else made here (the Django key is kept: sessions survive).
    agent_secret = _secret_from(base, "COLONY_AGENT_SECRET") or secrets.token_hex(32)
    django_key_file = secret_dir / "django-secret-key"
    django_key = _secret_from(base, "DJANGO_SECRET_KEY") or (
        django_key_file.read_text().strip() if django_key_file.exists() else secrets.token_urlsafe(50))
    redis_password = secrets.token_hex(24)
    version = redis_server_version(redis_server_binary())
    nodes = [(f"node-{number}", spec) for number, spec in enumerate(args.nodes or DEFAULT_NODES, start=1)]
    per_node_users = supports_acl_selectors(version)
    node_passwords = {node: signing.redis_password(agent_secret, node) for node, _ in nodes}
    redis = PrivateRedis(
        var_dir / "redis", port=free_port(6380), password=redis_password,
        acl_users={signing.redis_user(node): signing.redis_acl_rules(node, node_passwords[node])
                   for node, _ in nodes} if per_node_users else None,
    )
    files = {
        "COLONY_AGENT_SECRET": write_secret(secret_dir / "agent-secret", agent_secret),
        "DJANGO_SECRET_KEY": write_secret(django_key_file, django_key),
        "REDIS_URL": write_secret(secret_dir / "redis-url", redis.url),
    }
    database_url = _secret_from(base, "DATABASE_URL")
    if database_url:
        files["DATABASE_URL"] = write_secret(secret_dir / "database-url", database_url)
    for name in ("COLONY_CACHE_URL", "COLONY_METRICS_TOKEN"):
        if value := _secret_from(base, name):
            files[name] = write_secret(secret_dir / name.lower().replace("_", "-"), value)
    agent_files = {}
    for node, _spec in nodes:
        agent_url = (redis.user_url(signing.redis_user(node), node_passwords[node]) if per_node_users
                     else redis.url)
        agent_files[node] = (write_secret(secret_dir / f"{node}.key", signing.node_key(agent_secret, node).hex()),
                             write_secret(secret_dir / f"{node}.redis-url", agent_url))
    env = server_environment(base, files)
    env.update(devstack_settings(env, python, args.port))
    notebook_port = free_port(args.notebook_port or args.port + 1)
    env["COLONY_NOTEBOOK_PORT"] = str(notebook_port)  # where the job page sends browsers
    redis.start()
    version_text = ".".join(map(str, version))
    redis_line = (f"Redis {version_text}: password for the control plane, one ACL user per agent" if per_node_users
                  else f"Redis {version_text} has no ACL selectors (Redis >= 7): password only, which the agents "
                       f"share with the control plane")
    print(redis_line, flush=True)
    supervisor = Supervisor(var_dir, env)
    supervisor.adopt("redis", lambda: redis.start().process, log=var_dir / "redis" / f"redis-{redis.port}.log",
                     running=redis.process)
    stopping = False

    def request_stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        tenants, users = set_up_database(python, env, args.password)
        agents_root = var_dir / "agent"
        agents_root.mkdir(exist_ok=True)
        os.chmod(agents_root, 0o711)
        agent_path = env["PATH"]
        # Jobs get a clean PATH (never the agents'): the python they find comes first on it.
        job_path = str(Path(python).parent)
        if os.geteuid() == 0 and not args.jobs_as_root:
            bin_dir, python_note = jobs_python(python, agents_root / "bin")
            sandbox, accounts_line = job_accounts(tenants, agents_root, "" if bin_dir or not python_note
                                                  else python_note)
            if "--allow-root-jobs" not in sandbox:
                per_user, users_line = user_accounts(users, agents_root)
                sandbox += per_user
                accounts_line = f"{users_line}\n  (users made later: {accounts_line})"
            if bin_dir is not None and "--allow-root-jobs" not in sandbox:
                agent_path = f"{bin_dir}{os.pathsep}{agent_path}"
                job_path = str(bin_dir)
                accounts_line += f"\n  ({python_note})"
        elif os.geteuid() == 0:
            sandbox, accounts_line = ["--allow-root-jobs"], "Jobs run as ROOT (--jobs-as-root)"
        else:
            sandbox, accounts_line = [], ("Jobs run as your own user, not as their researchers' accounts "
                                          "(start as root for per-user accounts)")
        sandbox += ["--job-path", job_path]
        print(accounts_line, flush=True)
        for name, argv in celery_commands(python):
            supervisor.start(name, argv)
        supervisor.start("ingest", [python, "manage.py", "ingest"])
        agent_env = {**agent_environment(env), "PATH": agent_path}
        for node, spec in nodes:
            workdir = agents_root / node
            workdir.mkdir(exist_ok=True)
            os.chmod(workdir, 0o711)
            key_file, redis_file = agent_files[node]
            supervisor.start(f"agent-{node}", [python, "-m", "agents", "--node", node, "--simulate", spec,
                                               "--redis-file", str(redis_file), "--key-file", str(key_file),
                                               "--workdir", str(workdir), *sandbox],
                             env=agent_env, private=False)
        supervisor.start("web", [python, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload",
                                         "--insecure"])
        supervisor.start("notebooks", [python, "manage.py", "notebook_proxy", "--port", str(notebook_port)])
        _banner(args, redacted(redis.url), supervisor.log_dir, secret_dir, notebook_port)
        while not stopping:
            supervisor.poll()
            time.sleep(0.25)
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"set-up step failed: {' '.join(map(str, exc.cmd))}", file=sys.stderr)
        return 1
    finally:
        print("Stopping Colony...", flush=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        redis_child = next((child for child in supervisor.children if child.name == "redis"), None)
        if redis_child is not None:
            supervisor.children.remove(redis_child)
        supervisor.stop_all()
        redis.stop()
        print("Stopped.", flush=True)


def celery_commands(python: str) -> list[tuple[str, list[str]]]:
    """The Celery children: a general worker (default queue only), the scheduler (one process,
    ``--pool solo``, the only consumer of the ``scheduler`` queue, so that scheduling cycles keep
    what they carry from one to the next: jobs/services/scheduling_loop.py) and beat."""
    celery = [python, "-m", "celery", "-A", "cluster_ui"]
    return [
        ("worker", [*celery, "worker", "--loglevel=INFO", "--concurrency=2", "-Q", "celery", "-n", "worker@%h",
                    *QUIET_WORKER]),
        ("scheduler", [*celery, "worker", "--loglevel=INFO", "--pool=solo", "-Q", SCHEDULER_QUEUE, "-n",
                       "scheduler@%h", *QUIET_WORKER]),
        ("beat", [*celery, "beat", "--loglevel=INFO"]),
    ]


def _banner(args: argparse.Namespace, redis_url: str, log_dir: Path, secret_dir: Path, notebook_port: int) -> None:
    url = f"http://127.0.0.1:{args.port}/"
    print(f"""
Colony is up.
  Web:     {url}   (queue at {url}jobs/, admin at {url}admin/)
  Logins:  alice / {args.password}  (researcher, tenant vision)
           bob / {args.password}    (researcher, tenant nlp)
           operator / {args.password}  (staff: admin panel)
  CLI:     export PATH={Path(sys.executable).parent}:$PATH COLONY_URL={url}
           colony login --username alice ; cd your-project ; colony submit --gpus 1 -- python train.py
           colony shell --gpus 1 ; colony jupyter --gpus 1   (a terminal, a notebook on a GPU)
  Notebooks: http://127.0.0.1:{notebook_port}/notebooks/<job>/   (opened from the job page: Open notebook)
  API:     curl -s -X POST {url}api/v1/auth/token/ -d username=alice -d password={args.password}
           curl -s -H "Authorization: Token <token>" -H "Content-Type: application/json" \\
                -d '{{"command": ["python", "-c", "print(42)"], "gpus": 1}}' {url}api/v1/jobs/
  Redis:   {redis_url}   (password in {secret_dir / 'redis-url'})
  Agents:  sign their messages with per-node keys (a secret made for this run)
  Secrets: {secret_dir}/ (mode 700; children get file paths, never values)
  Logs:    {log_dir}/
A child that dies is restarted (with backoff). Press Ctrl-C to stop everything.
""", flush=True)
