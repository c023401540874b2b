"""No secret is reachable from a job (issue 12, item 4), attacked as a job would.

On the real dev stack (``make run``): no process's ``/proc/<pid>/environ`` or command line holds
the agent secret, a node key, a Redis password or the Django secret key; the files that do hold
them are 600 in a 700 directory; Redis refuses a client without the password and each agent's
ACL user cannot read another node's commands; run as root, jobs of different tenants run under
different unprivileged uids and a job that reads everything it can finds no secret. And every
entry point that holds a secret is non-dumpable (no ptrace, no core dump, /proc files root's).
"""

from __future__ import annotations

import base64
import glob
import os
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry

from agents import protocol, signing
from tests.e2e.conftest import ROOT, devstack, devstack_dir, wait_for  # noqa: F401 (fixture)

# A job's attack: print its uid, then everything it can read of every process's environment and
# command line, and of every file under the stack's var dir (whose path it is given).
ATTACK = textwrap.dedent("""
    import os, sys, glob
    print("UID", os.getuid())
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            print("READ", path, open(path, "rb").read().replace(b"\\0", b" ").decode("latin-1"))
        except OSError:
            pass
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            argv = open(path, "rb").read().split(b"\\0")
        except OSError:
            continue
        if b"agents" in argv and b"--node" in argv:  # the agent: may this job signal it?
            try:
                os.kill(int(path.split("/")[2]), 0)
                print("SIGNAL_ALLOWED", path)
            except PermissionError:
                print("SIGNAL_DENIED", path)
            except ProcessLookupError:
                pass
    for top, dirs, files in os.walk(sys.argv[1], onerror=lambda e: print("DENIED", e.filename)):
        for name in files:
            path = os.path.join(top, name)
            try:
                print("READ", path, open(path, "rb").read(65536).decode("latin-1"))
            except OSError:
                print("DENIED", path)
    for name in sys.argv[2:]:
        path = os.path.join(sys.argv[1], name)
        try:
            open(path).read()
            print("STOLEN", path)
        except OSError:
            print("DENIED", path)
    print("DONE")
""")


# The API takes arguments of up to 4 KiB: the attack travels compressed.
PACKED_ATTACK = ("import base64, zlib; exec(zlib.decompress(base64.b64decode('"
                 + base64.b64encode(zlib.compress(ATTACK.encode())).decode() + "')))")

# Files of the stack a job must not read (the database holds every tenant's jobs and tokens).
KNOWN_FILES = ["colony.sqlite3", "secrets/agent-secret", "secrets/node-1.key", "secrets/node-1.redis-url",
               "secrets/redis-url", "secrets/django-secret-key", "log/agent-node-1.log", "log/web.log"]


def stack_secrets(var_dir: Path) -> dict[str, str]:
    """Every secret the stack holds, by where it is kept (the test runs as the stack's user)."""
    directory = var_dir / "secrets"
    found = {
        "agent secret": (directory / "agent-secret").read_text().strip(),
        "Django secret key": (directory / "django-secret-key").read_text().strip(),
        "Redis password": urlsplit((directory / "redis-url").read_text().strip()).password,
    }
    for key_file in sorted(directory.glob("node-*.key")):
        node = key_file.name.removesuffix(".key")
        found[f"{node} key"] = key_file.read_text().strip()
        found[f"{node} Redis password"] = urlsplit((directory / f"{node}.redis-url").read_text().strip()).password
    assert all(value and len(value) >= 16 for value in found.values()), found
    return found


def proc_texts(name: str) -> dict[int, bytes]:
    texts = {}
    for path in glob.glob(f"/proc/[0-9]*/{name}"):
        try:
            texts[int(path.split("/")[2])] = Path(path).read_bytes()
        except OSError:
            continue
    return texts


@pytest.mark.e2e
def test_no_secret_in_any_process_environment_and_a_job_finds_none(devstack_dir):
    with devstack(devstack_dir) as stack:
        var_dir = stack.var_dir
        secrets = stack_secrets(var_dir)
        assert (var_dir / "secrets").stat().st_mode & 0o777 == 0o700
        assert {path.name: path.stat().st_mode & 0o777 for path in (var_dir / "secrets").iterdir()} == {
            path.name: 0o600 for path in (var_dir / "secrets").iterdir()}

        # Every process on the machine, the stack's own first: its environment and command line.
        children = stack.command_lines()
        environs, cmdlines = proc_texts("environ"), proc_texts("cmdline")
        # One that ended between the two reads (a short-lived helper) has nothing left to leak;
        # every one still there must have been scanned.
        children = {pid: cmd for pid, cmd in children.items() if pid in environs or psutil.pid_exists(pid)}
        assert set(children) <= set(environs), "the scan must see every process of the stack"
        agent_pids = [pid for pid, cmd in children.items() if "-m agents" in cmd]
        assert len(agent_pids) == 2 and all(b"PATH=" in environs[pid] for pid in agent_pids)
        web = next(pid for pid, cmd in children.items() if "runserver" in cmd)
        assert b"COLONY_AGENT_SECRET_FILE=" in environs[web]  # the path travels, not the value
        leaks = [(what, pid, kind) for kind, texts in (("environ", environs), ("cmdline", cmdlines))
                 for pid, text in texts.items() for what, value in secrets.items() if value.encode() in text]
        assert leaks == []

        # Redis: no password, no entry; a node's own user cannot read another node's commands.
        port = urlsplit((var_dir / "secrets" / "redis-url").read_text().strip()).port
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis(port=port, retry=Retry(NoBackoff(), 0)).set("colony:probe", 1)  # refused at once
        version = redis_lib.Redis.from_url((var_dir / "secrets" / "redis-url").read_text().strip()).info(
            "server")["redis_version"]
        if int(version.split(".")[0]) >= 7:
            node_1 = redis_lib.Redis.from_url((var_dir / "secrets" / "node-1.redis-url").read_text().strip())
            assert node_1.ping()
            with pytest.raises(redis_lib.exceptions.NoPermissionError):
                node_1.xrange(protocol.command_stream("node-2"))
            assert f"{signing.redis_user('node-1')}:" in (var_dir / "secrets" / "node-1.redis-url").read_text()

        # Jobs of two tenants attack: read every environ, command line and file they can.
        if os.geteuid() != 0:
            return  # jobs run as the developer's own account; uids cannot differ
        assert "Jobs run per tenant under their own accounts" in stack.output(), stack.output()
        uids = {}
        tokens = {user: stack.token(user) for user in ("alice", "bob")}
        # Both attack at once (one scheduling cycle, not one after the other).
        submitted = {user: stack.api("POST", "jobs/", token, {
            "command": ["python", "-c", PACKED_ATTACK, str(var_dir), *KNOWN_FILES], "gpus": 1})
            for user, token in tokens.items()}
        for user, job in submitted.items():
            job = stack.wait_for_end(tokens[user], job, timeout=90)
            assert job["state"] == "SUCCEEDED", job
            (log,) = glob.glob(str(var_dir / "agent" / "*" / "jobs" / str(job["id"]) / "output.log"))
            output = Path(log).read_text(errors="replace")
            assert "DONE" in output
            uids[user] = int(output.split("UID ", 1)[1].split()[0])
            assert re.findall(r"^STOLEN .*", output, re.M) == []
            assert re.findall(r"^SIGNAL_ALLOWED .*", output, re.M) == []
            # Both of this stack's agents were tried and neither could be signalled (an agent left
            # on the machine by another run is tried too: it counts for nothing either way).
            denied = {int(pid) for pid in re.findall(r"^SIGNAL_DENIED /proc/(\d+)/cmdline$", output, re.M)}
            assert set(agent_pids) <= denied, (agent_pids, denied)
            assert all(f"\nDENIED {var_dir / name}\n" in output for name in KNOWN_FILES), output[-2000:]
            assert [what for what, value in secrets.items() if value in output] == [], user
        assert 0 not in uids.values() and uids["alice"] != uids["bob"], uids


# ---------------------------------------------------------------- non-dumpable entry points

REPORT = "from agents.hardening import is_dumpable; print('DUMPABLE', is_dumpable())"


def _dumpable(argv: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")
    env["COLONY_VAR_DIR"] = env.get("COLONY_VAR_DIR", str(ROOT / "var"))
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    line = next((line for line in out.stdout.splitlines() if line.startswith("DUMPABLE")), None)
    assert line, out.stdout + out.stderr
    return line.split()[1]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_DUMPABLE) is Linux only")
def test_every_entry_point_that_holds_a_secret_is_non_dumpable():
    python = sys.executable
    # A plain interpreter is dumpable: the check can tell.
    assert _dumpable([python, "-c", REPORT]) == "True"
    agent = (f"import agents.agent as a, agents.cli as c; a.Agent.run = lambda self, stop: exec({REPORT!r}); "
             "c.main(['--node', 'n1', '--simulate', '1xT4-16GB', '--redis', 'redis://127.0.0.1:1/0'])")
    celery = ("from celery import signals; import cluster_ui.celery; "
              f"signals.worker_init.send(sender=None); {REPORT}")
    beat = f"from celery import signals; import cluster_ui.celery; signals.beat_init.send(sender=None); {REPORT}"
    results = {
        "agent": _dumpable([python, "-c", agent]),
        "manage.py": _dumpable([python, "manage.py", "shell", "-c", REPORT]),
        "wsgi": _dumpable([python, "-c", f"import cluster_ui.wsgi; {REPORT}"]),
        "asgi": _dumpable([python, "-c", f"import cluster_ui.asgi; {REPORT}"]),
        "celery worker": _dumpable([python, "-c", celery]),
        "celery beat": _dumpable([python, "-c", beat]),
    }
    assert results == dict.fromkeys(results, "False")


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"), reason="needs root to play a job")
def test_a_job_under_the_agents_own_account_cannot_read_its_environment(devstack_dir):
    """The agent's own account: a non-dumpable process's /proc files belong to root, so a job of
    the same uid cannot read its environment; a dumpable one of that uid it can (the control)."""
    import pwd

    account = next((entry for entry in pwd.getpwall() if entry.pw_name in ("nobody", "colony-jobs")), None)
    if account is None:
        pytest.skip("no unprivileged account to play the agent's")
    as_account = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    hold = "import sys, time; sys.stdin.read(1); time.sleep(30)"
    hardened = f"from agents.hardening import make_non_dumpable; make_non_dumpable(); {hold}"
    interpreter = "/usr/bin/python3"
    if not os.access(interpreter, os.X_OK):
        pytest.skip("no system python3 other accounts can run")
    tmp_path = devstack_dir.parent  # other accounts can pass through it (pytest's tmp_path: no)
    env = {"PYTHONPATH": str(tmp_path), "SECRET_LOOKING": "x"}
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("")
    (tmp_path / "agents" / "hardening.py").write_text((ROOT / "agents" / "hardening.py").read_text())
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:
        if not os.stat(parent).st_mode & 0o001:
            pytest.skip(f"{parent} is not searchable by other accounts")
    processes = {name: subprocess.Popen([interpreter, "-c", code], env=env, stdin=subprocess.PIPE, **as_account)
                 for name, code in (("plain", hold), ("hardened", hardened))}
    try:
        wait_for(lambda: all(b"SECRET_LOOKING" in Path(f"/proc/{p.pid}/environ").read_bytes()
                             for p in processes.values()), timeout=10, what="the processes")
        wait_for(lambda: Path(f"/proc/{processes['hardened'].pid}/environ").stat().st_uid == 0, timeout=10,
                 what="the hardened process to become non-dumpable")
        reader = [interpreter, "-c", "import sys; open(sys.argv[1], 'rb').read(); print('READ')"]
        can_read = {name: subprocess.run([*reader, f"/proc/{p.pid}/environ"], capture_output=True, text=True,
                                         **as_account).stdout.strip() == "READ"
                    for name, p in processes.items()}
        assert can_read == {"plain": True, "hardened": False}
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
