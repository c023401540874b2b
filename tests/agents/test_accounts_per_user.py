"""Jobs run as their researcher: the launch names its submitter, the node maps them to their own
account (the map file, else the same name through NSS at or above --min-user-uid), never root and
never a system account by accident; an unknown account refuses the launch with a reason that
reaches the user. Also what a job may not set in its environment, and the PATH it gets."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from agents import cli, protocol, signing
from agents.accounts import JOB_PATH, Account, NoAccount, RunAsPolicy, lookup_account, lookup_user
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.runner import JobRunner, LaunchError

from .conftest import RunningAgent
from .helpers import events, launch, python, wait_for

KEY = signing.node_key("s" * 32, "n1")


def _useradd(name: str, *, system: bool) -> Account:
    made = subprocess.run(["useradd", *(["--system"] if system else []), "--no-create-home", "--user-group",
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    return lookup_account(name)


@pytest.fixture(scope="module")
def researchers():
    """Two fresh login-range accounts (uid >= 1000) and one system account, deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("creating throwaway accounts needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel not available")
    tag = uuid.uuid4().hex[:6]
    names = {"alice": f"ct-alice-{tag}", "bob": f"ct-bob-{tag}", "daemon": f"ct-svc-{tag}"}
    made: dict[str, Account] = {}
    try:
        made["alice"] = _useradd(names["alice"], system=False)
        made["bob"] = _useradd(names["bob"], system=False)
        made["daemon"] = _useradd(names["daemon"], system=True)
        if made["alice"].uid < 1000 or made["daemon"].uid >= 1000:
            pytest.skip("this system's useradd does not give login accounts uids from 1000")
        yield made
    finally:
        for name in names.values():
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def open_dir():
    """A directory other accounts may pass through (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="colony-accounts-", dir="/tmp"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def python_for_anyone():
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and all(os.stat(p).st_mode & stat.S_IXOTH
                                        for p in [real, *map(str, Path(real).parents)]):
            return candidate
    pytest.skip("no Python interpreter that other accounts may execute")


@pytest.fixture
def make_runner(open_dir):
    made: list[JobRunner] = []

    def make(run_as: RunAsPolicy, **options) -> JobRunner:
        made.append(JobRunner(open_dir / f"agent-{len(made)}", duty_period=0.5, run_as=run_as, **options))
        return made[-1]

    yield make
    for runner in made:
        runner.stop_all(0)
        runner.close()


def finish(runner: JobRunner, count: int = 1) -> dict:
    done: dict = {}
    wait_for(lambda: done.update({f.job_id: f for f in runner.poll()}) or len(done) >= count, timeout=30)
    return done


WRITES = """
import json, os
open('written-by-job', 'w').write('mine')
print(json.dumps({'uid': os.getuid(), 'user': os.environ.get('USER'), 'logname': os.environ.get('LOGNAME')}))
"""


def per_user(**options) -> RunAsPolicy:
    return RunAsPolicy.configure(agent_uid=0, **options)


# ---------------------------------------------------------------- jobs run as their researcher


def test_teammates_jobs_run_as_their_own_accounts_and_files_they_write_are_theirs(
        make_runner, researchers, python_for_anyone):
    alice, bob = researchers["alice"], researchers["bob"]
    # A per-tenant account is configured too: it is only the fallback, never used for them.
    runner = make_runner(per_user(tenant_accounts={"vision": "nobody"}))
    jobs = {who.name: launch([python_for_anyone, "-c", WRITES], tenant="vision", user=who.name) for who in (alice, bob)}
    for cmd in jobs.values():
        runner.launch(cmd)
    done = finish(runner, 2)
    for who in (alice, bob):
        cmd = jobs[who.name]
        assert done[cmd.job_id].exit_code == 0, done[cmd.job_id].output_tail
        seen = json.loads(done[cmd.job_id].output_tail)
        assert (seen["uid"], seen["user"], seen["logname"]) == (who.uid, who.name, who.name)
        written = runner.work_dir(cmd.job_id) / "written-by-job"
        assert (written.stat().st_uid, written.stat().st_gid) == (who.uid, who.gid)


def test_the_identity_providers_posix_name_picks_the_account(make_runner, researchers, python_for_anyone):
    alice = researchers["alice"]
    runner = make_runner(per_user())
    cmd = launch([python_for_anyone, "-c", WRITES], user="alice@example.org", posix_user=alice.name)
    runner.launch(cmd)
    [done] = finish(runner).values()
    assert json.loads(done.output_tail)["uid"] == alice.uid


def test_the_account_map_maps_a_colony_user_to_any_account_but_root(make_runner, researchers, python_for_anyone,
                                                                    open_dir):
    service = researchers["daemon"]  # a system account: only an explicit map entry may name it
    account_map = open_dir / "accounts.map"
    account_map.write_text(f"# colony user -> POSIX account\ncarol {service.name}\n\n")
    args = cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--account-map", str(account_map)])
    runner = make_runner(args.run_as_policy)
    cmd = launch([python_for_anyone, "-c", WRITES], user="carol")
    runner.launch(cmd)
    [done] = finish(runner).values()
    assert json.loads(done.output_tail)["uid"] == service.uid


def test_a_user_called_like_a_system_account_never_runs_as_it(make_runner, researchers):
    service = researchers["daemon"]
    # Even where the operator lets unmapped jobs run as root, a name that is a system account (or
    # root itself) is refused, not run as that account.
    runner = make_runner(per_user(allow_root=True))
    for name in (service.name, "root"):
        with pytest.raises(LaunchError, match="a system account below --min-user-uid 1000; jobs never run as one"):
            runner.launch(launch(python("print('ran')"), user=name))
    # "0" is a name, never a uid.
    strict = make_runner(per_user())
    with pytest.raises(LaunchError, match="no account on this node for user '0'"):
        strict.launch(launch(python("print('ran')"), user="0"))
    assert runner.running() == set() and strict.running() == set()


def test_a_map_entry_naming_root_stops_the_agent_at_start(tmp_path, capsys):
    account_map = tmp_path / "accounts.map"
    account_map.write_text("mallory root\n")
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--account-map", str(account_map)])
    assert stopped.value.code == 2
    assert "mapped to root" in capsys.readouterr().err
    account_map.write_text("alice one two\n")
    with pytest.raises(SystemExit):
        cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--account-map", str(account_map)])
    assert "line 1: expected COLONY_USER POSIX_ACCOUNT" in capsys.readouterr().err


def test_an_unknown_account_refuses_the_launch_with_a_reason_the_user_reads(
        redis_url, redis_client, open_dir):
    runner = JobRunner(open_dir / "agent", run_as=per_user())
    agent = Agent("n1", SimulatedBackend("1xT4-16GB", "n1"), redis_url, runner, interval=0.1, heartbeat_ttl=5,
                  shutdown_grace=1.0, key=KEY)
    running = RunningAgent(agent)
    try:
        [registered] = wait_for(lambda: events(redis_client, "node_registered"))
        assert registered.job_fences == ["accounts"]
        cmd = launch(python("print('ran')"), user=f"nobody-here-{uuid.uuid4().hex[:6]}", attempt=0)
        _send_signed(redis_client, cmd)
        [done] = wait_for(lambda: [e for e in events(redis_client, "job_exited") if e.job_id == cmd.job_id])
        assert done.exit_code is None
        assert done.error.startswith(f"node n1: no account on this node for user {cmd.user!r}")
        assert running.thread.is_alive()
    finally:
        running.stop()


def test_the_submitter_is_inside_the_commands_mac(redis_url, redis_client, open_dir, researchers):
    runner = JobRunner(open_dir / "agent", run_as=per_user())
    agent = Agent("n1", SimulatedBackend("1xT4-16GB", "n1"), redis_url, runner, interval=0.1, heartbeat_ttl=5,
                  shutdown_grace=1.0, key=KEY)
    running = RunningAgent(agent)
    try:
        wait_for(lambda: events(redis_client, "node_registered"))
        marker = open_dir / "ran-as-bob"
        cmd = launch(python(f"open({str(marker)!r}, 'w')"), user=researchers["alice"].name, attempt=0)
        fields = _signed_fields(cmd)
        # Whoever can write the stream swaps the submitter for another researcher; the MAC is left.
        fields["m"] = fields["m"].replace(f'"user":"{researchers["alice"].name}"',
                                          f'"user":"{researchers["bob"].name}"')
        assert researchers["bob"].name in fields["m"]
        redis_client.xadd(protocol.command_stream("n1"), fields)
        [rejected] = wait_for(lambda: events(redis_client, "command_rejected"))
        assert "bad signature" in rejected.reason
        assert not marker.exists() and runner.running() == set()
    finally:
        running.stop()


def test_an_agent_that_is_not_root_runs_every_researchers_job_as_itself():
    policy = RunAsPolicy(agent_uid=1234, user_accounts="nss")
    assert policy.account_for("vision", "alice") is None
    assert "not root" in policy.describe()


def test_lookup_is_by_name_only():
    assert lookup_user("0") is None and lookup_user("root").uid == 0
    with pytest.raises(NoAccount):
        RunAsPolicy(agent_uid=0, user_accounts="nss").account_for(None, "root")


# ---------------------------------------------------------------- what a job may not set


@pytest.mark.parametrize("name", ["HOME", "USER", "LOGNAME", "SHELL", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"])
def test_a_job_may_not_set_who_it_is_unless_the_operator_allows_it(make_runner, name, tmp_path):
    runner = make_runner(RunAsPolicy(allow_root=True))
    marker = tmp_path / "ran"
    with pytest.raises(LaunchError, match=f"the job's environment sets {name}, which would change who the job is"):
        runner.launch(launch(python(f"open({str(marker)!r}, 'w')"), env={name: "/tmp/evil.so"}))
    assert not marker.exists() and runner.running() == set()
    allowed = make_runner(RunAsPolicy(allow_root=True), allowed_env=(name,))
    cmd = launch(python(f"import os; print(os.environ[{name!r}])"), env={name: "/opt/site"})
    allowed.launch(cmd)
    [done] = finish(allowed).values()
    assert done.output_tail.endswith("/opt/site\n")  # (the loader complains of a missing /opt/site)


def test_an_ld_preload_launch_through_the_agent_is_refused_and_reported(redis_url, redis_client, open_dir, tmp_path):
    runner = JobRunner(open_dir / "agent", run_as=RunAsPolicy(allow_root=True))
    running = RunningAgent(Agent("n1", SimulatedBackend("1xT4-16GB", "n1"), redis_url, runner, interval=0.1,
                                 heartbeat_ttl=5, shutdown_grace=1.0, key=KEY))
    try:
        wait_for(lambda: events(redis_client, "node_registered"))
        marker = tmp_path / "ran"
        cmd = launch(python(f"open({str(marker)!r}, 'w')"), env={"LD_PRELOAD": "/tmp/x.so"}, attempt=0)
        _send_signed(redis_client, cmd)
        [done] = wait_for(lambda: [e for e in events(redis_client, "job_exited") if e.job_id == cmd.job_id])
        assert done.exit_code is None and "sets LD_PRELOAD" in done.error and not marker.exists()
    finally:
        running.stop()


def test_a_job_gets_a_clean_path_not_the_agents(make_runner, monkeypatch):
    monkeypatch.setenv("PATH", f"/root/.cargo/bin:{os.environ['PATH']}")
    runner = make_runner(RunAsPolicy(allow_root=True), job_path=("/usr/local/cuda/bin",))
    cmd = launch(python("import os; print(os.environ['PATH'])"))
    runner.launch(cmd)
    [done] = finish(runner).values()
    assert done.output_tail == ":".join(("/usr/local/cuda/bin", *JOB_PATH)) + "\n"


def test_job_path_and_allowed_names_come_from_the_command_line(monkeypatch):
    monkeypatch.setenv("COLONY_AGENT_ALLOW_JOB_ENV", "LD_LIBRARY_PATH")
    args = cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--job-path", "/opt/cuda/bin:/opt/x/bin"])
    assert args.job_path == ("/opt/cuda/bin", "/opt/x/bin") and args.allowed_env == ("LD_LIBRARY_PATH",)


def _signed_fields(cmd: protocol.LaunchJob) -> dict:
    stamped = cmd.model_copy(update={"node": "n1", "issued_at": time.time()})
    return signing.signed_command(protocol.encode(stamped), KEY)


def _send_signed(client, cmd: protocol.LaunchJob) -> None:
    client.xadd(protocol.command_stream("n1"), _signed_fields(cmd))
