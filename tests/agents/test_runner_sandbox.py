"""What contains a job: its account, its environment, its working directory and its log size."""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agents import cli, protocol
from agents.accounts import Account, RunAsPolicy, lookup_account
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.joblog import MIN_MAX_LOG_BYTES, BoundedLog
from agents.runner import JobRunner, LaunchError

from .conftest import RunningAgent
from .helpers import events, launch, python, send, wait_for

ROOT_OK = RunAsPolicy(allow_root=True)


def finish(runner: JobRunner, timeout: float = 10.0):
    return wait_for(runner.poll, timeout)


@pytest.fixture
def make_runner(tmp_path):
    made: list[JobRunner] = []

    def make(**options) -> JobRunner:
        options.setdefault("run_as", ROOT_OK)
        made.append(JobRunner(tmp_path / f"agent-{len(made)}", duty_period=0.5, **options))
        return made[-1]

    yield make
    for runner in made:
        runner.stop_all(0)
        runner.close()


# ---------------------------------------------------------------- environment


def test_agent_secrets_do_not_reach_the_job(make_runner, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@control:6379/0")
    monkeypatch.setenv("COLONY_REDIS_URL", "redis://:hunter2@control:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    runner = make_runner(pass_env=("PATH", "LC_*", "NCCL_*", "REDIS_URL"))  # the Redis URL is never passed
    cmd = launch(
        python("import json, os; print(json.dumps(dict(os.environ)))"),
        gpus=[1],
        env={"EPOCHS": "3", "CUDA_VISIBLE_DEVICES": "0,1", "COLONY_JOB_ID": "1"},
    )
    runner.launch(cmd)
    [done] = finish(runner)
    env = json.loads(done.output_tail)
    assert "hunter2" not in done.output_tail
    assert {"REDIS_URL", "COLONY_REDIS_URL", "AWS_SECRET_ACCESS_KEY"}.isdisjoint(env)
    assert env["PATH"] == os.environ["PATH"] and env["NCCL_DEBUG"] == "INFO" and env["LC_ALL"] == "C.UTF-8"
    assert env["EPOCHS"] == "3"
    # Colony's own variables win over the spec's.
    assert (env["CUDA_VISIBLE_DEVICES"], env["COLONY_JOB_ID"]) == ("1", str(cmd.job_id))
    assert set(env) <= {"PATH", "LC_ALL", "NCCL_DEBUG", "HOME", "USER", "LOGNAME", "PYTHONUNBUFFERED", "EPOCHS",
                        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "COLONY_JOB_ID", "COLONY_PREEMPT_FILE", "LC_CTYPE"}


def test_only_allow_listed_agent_variables_are_inherited_by_default(make_runner, monkeypatch):
    monkeypatch.setenv("SOME_SITE_SETTING", "agent-only")
    runner = make_runner()
    runner.launch(launch(python("import os; print(os.environ.get('SOME_SITE_SETTING'), os.environ['PATH'] != '')")))
    [done] = finish(runner)
    assert done.output_tail == "None True\n"


# ---------------------------------------------------------------- working directory


@pytest.mark.parametrize("field", ["cwd", "uid", "account", "shell"])
def test_a_launch_cannot_ask_for_a_directory_account_or_shell(field):
    # (It names its submitter, ``user``, whose account the node picks: see test_accounts_per_user.)
    payload = {"v": 1, "kind": "launch", "command_id": "c1", "job_id": 7, "argv": ["true"], "gpu_indices": [],
               field: "/etc"}
    with pytest.raises(protocol.ProtocolError, match=f"{field}: Extra inputs are not permitted"):
        protocol.decode_command({"m": json.dumps(payload)})


def test_the_spec_environment_does_not_move_the_working_directory(make_runner):
    runner = make_runner(allowed_env=("HOME",))  # (HOME is refused unless the operator allows it)
    cmd = launch(python("import os; print(os.getcwd())"), env={"PWD": "/etc", "OLDPWD": "/", "HOME": "/tmp/cache"})
    runner.launch(cmd)
    [done] = finish(runner)
    assert done.output_tail == f"{runner.work_dir(cmd.job_id)}\n"
    assert runner.work_dir(cmd.job_id).parent == runner.job_dir(cmd.job_id)
    # The log lives beside the working directory, where the job cannot replace it.
    assert (runner.job_dir(cmd.job_id) / "output.log").read_text() == done.output_tail


# ---------------------------------------------------------------- accounts


def test_a_root_agent_refuses_jobs_without_an_account(make_runner):
    runner = make_runner(run_as=RunAsPolicy(agent_uid=0))
    with pytest.raises(LaunchError, match="runs as root and has no unprivileged account.*--run-as"):
        runner.launch(launch(python("print('ran')")))
    assert runner.running() == set()


def test_a_root_agent_refuses_unmapped_tenants_without_a_default(make_runner):
    nobody = lookup_account("nobody")
    runner = make_runner(run_as=RunAsPolicy(tenants={"vision": nobody}, agent_uid=0))
    with pytest.raises(LaunchError, match="no unprivileged account for tenant 'nlp'"):
        runner.launch(launch(["true"], tenant="nlp"))


def test_refusal_is_reported_as_a_failed_launch(redis_url, redis_client, tmp_path):
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(agent_uid=0))
    running = RunningAgent(Agent("n1", SimulatedBackend("1xT4-16GB", "n1"), redis_url, runner, interval=0.1,
                                 heartbeat_ttl=5.0, shutdown_grace=1.0))
    try:
        wait_for(lambda: events(redis_client, "node_registered"))
        cmd = launch(python("print('ran')"))
        send(redis_client, "n1", cmd)
        [exited] = wait_for(lambda: events(redis_client, "job_exited"))
    finally:
        running.stop()
    assert (exited.job_id, exited.exit_code) == (cmd.job_id, None)
    assert "runs as root" in exited.error and "--allow-root-jobs" in exited.error
    assert not events(redis_client, "job_started")


def test_an_agent_that_is_not_root_runs_jobs_as_itself():
    policy = RunAsPolicy.configure(None, None, agent_uid=1234)
    assert policy.account_for("vision") is None
    assert "own user" in policy.describe()


@pytest.mark.parametrize(
    "run_as, tenants, agent_uid, message",
    [
        ("root", None, 0, "--run-as: refusing to run jobs as root"),
        (None, {"vision": "0"}, 0, "--run-as-tenant vision: refusing to run jobs as root"),
        ("no-such-user-x", None, 0, "--run-as: no such user 'no-such-user-x'"),
        ("nobody:no-such-group-x", None, 0, "no such group 'no-such-group-x'"),
        ("nobody", None, 1234, "the agent runs as uid 1234, not root, so it cannot run jobs as 'nobody'"),
    ],
)
def test_bad_run_as_settings_are_rejected_at_start(run_as, tenants, agent_uid, message):
    with pytest.raises(ValueError, match=message):
        RunAsPolicy.configure(run_as, tenants, agent_uid=agent_uid)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--run-as", "no-such-user-x"], "--run-as: no such user"),
        (["--run-as-tenant", "vision"], "expected TENANT=USER"),
        (["--run-as-tenant", "vision=nobody,vision=root"], "mapped twice"),
        (["--max-log-bytes", "1K"], "must be at least 64K"),
        (["--max-log-bytes", "lots"], "not a size"),
    ],
)
def test_bad_sandbox_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", *argv])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_sandbox_arguments_and_their_environment_variables(monkeypatch):
    if os.geteuid() == 0:  # an agent that is not root rejects accounts other than its own
        monkeypatch.setenv("COLONY_AGENT_RUN_AS_TENANT", "vision=nobody")
    monkeypatch.setenv("COLONY_AGENT_ALLOW_ROOT_JOBS", "1")
    monkeypatch.setenv("COLONY_AGENT_PASS_ENV", "NCCL_*,HF_HOME")
    monkeypatch.setenv("COLONY_AGENT_MAX_LOG_BYTES", "2M")
    args = cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB"])
    assert args.allow_root_jobs and args.max_log_bytes == 2 * 1024 * 1024
    assert args.pass_env[-2:] == ("NCCL_*", "HF_HOME")
    if os.geteuid() == 0:
        assert args.run_as_policy.tenants["vision"].name == "nobody"
    args = cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", "--max-log-bytes", "65536"])
    assert args.max_log_bytes == 65536


def _world_runnable(path: str) -> bool:
    """Whether any account may execute ``path`` (every directory on the way searchable)."""
    path = os.path.realpath(path)
    parts = Path(path).parents
    if not os.path.isfile(path) or not os.stat(path).st_mode & stat.S_IXOTH:
        return False
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in parts)


@pytest.fixture(scope="module")
def throwaway_account():
    """A fresh local account, deleted afterwards; skips where one cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("creating a throwaway account needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel not available to create a throwaway account")
    name = f"colony-t{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                           name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        yield lookup_account(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(scope="module")
def python_for_anyone():
    """An interpreter another account can run (this virtualenv may sit under /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_runnable(candidate):
            return candidate
    pytest.skip("no Python interpreter that other accounts may execute")


PROBE = """
import json, os
open('written-by-job', 'w').write('ok')
try:
    open('../output.log', 'a').write('forged')
    log_writable = True
except OSError:
    log_writable = False
print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'groups': sorted(os.getgroups()),
                  'cwd': os.getcwd(), 'user': os.environ.get('USER'), 'home': os.environ.get('HOME'),
                  'log_writable': log_writable}))
"""


def test_job_runs_as_the_tenants_account(make_runner, throwaway_account, python_for_anyone, passable_tmp_path):
    nobody = lookup_account("nobody")
    runner = make_runner(run_as=RunAsPolicy(default=nobody, tenants={"vision": throwaway_account}, agent_uid=0))
    mine = launch([python_for_anyone, "-c", PROBE], tenant="vision")
    other = launch([python_for_anyone, "-c", "import os; print(os.getuid())"], tenant="nlp")
    runner.launch(mine)
    runner.launch(other)
    done = {}
    wait_for(lambda: done.update({f.job_id: f for f in runner.poll()}) or len(done) == 2, timeout=10)
    assert done[mine.job_id].exit_code == 0, done[mine.job_id].output_tail
    seen = json.loads(done[mine.job_id].output_tail)
    account: Account = throwaway_account
    assert (seen["uid"], seen["euid"], seen["gid"]) == (account.uid, account.uid, account.gid)
    assert set(seen["groups"]) <= set(account.groups)  # none of the agent's own groups
    assert seen["user"] == account.name
    work = runner.work_dir(mine.job_id)
    assert seen["cwd"] == str(work) and seen["home"] == str(work)  # its home does not exist
    assert seen["log_writable"] is False
    assert (work / "written-by-job").stat().st_uid == account.uid
    assert (work.stat().st_uid, stat.S_IMODE(work.stat().st_mode)) == (account.uid, 0o700)
    log = runner.job_dir(mine.job_id) / "output.log"
    assert (log.stat().st_uid, log.stat().st_gid, stat.S_IMODE(log.stat().st_mode)) == (0, account.gid, 0o640)
    # A tenant without its own account falls back to the default one.
    assert done[other.job_id].output_tail == f"{pwd.getpwnam('nobody').pw_uid}\n"


# ---------------------------------------------------------------- output size


def test_a_chatty_job_keeps_a_bounded_log_and_its_exit_code(make_runner):
    bound = MIN_MAX_LOG_BYTES
    runner = make_runner(max_log_bytes=bound)
    chatty = "import sys\nfor i in range(40000): print(f'line {i:06d}')\nprint('END'); sys.exit(3)"
    cmd = launch(python(chatty))
    runner.launch(cmd)
    [done] = finish(runner, timeout=20)
    assert done.exit_code == 3
    log = (runner.job_dir(cmd.job_id) / "output.log").read_bytes()
    assert len(log) <= bound
    assert log.startswith(b"line 000000\nline 000001\n")  # the head is kept
    assert b"bytes of output left out here]" in log
    assert done.output_tail.endswith("line 039998\nline 039999\nEND\n")
    assert len(done.output_tail.encode()) <= protocol.OUTPUT_TAIL_BYTES


@pytest.mark.parametrize("seed", range(6))
def test_bounded_log_keeps_head_marker_and_tail(tmp_path, seed):
    rng = random.Random(seed)
    bound = MIN_MAX_LOG_BYTES * rng.choice([1, 2, 3])
    path = tmp_path / "output.log"
    output, write_fd = BoundedLog.open(path, bound)
    output.start()
    sent = bytearray()
    try:
        while len(sent) < bound * rng.choice([0.5, 3, 10]):
            chunk = bytes(rng.randrange(97, 123) for _ in range(rng.choice([1, 100, 5000, 70000])))
            os.write(write_fd, chunk)
            sent += chunk
    finally:
        os.close(write_fd)
    output.finish(5)
    log = path.read_bytes()
    assert len(log) <= bound
    if len(sent) <= bound:
        assert log == sent and output.dropped == 0
        return
    head = bound // 8
    marker_at = log.index(b"\n[colony: ", head)
    assert marker_at == head and log[:head] == sent[:head]
    marker_end = log.index(b"\n", marker_at + 1) + 1
    marker = log[marker_at:marker_end]
    assert f"[colony: {output.dropped} bytes of output left out here]".encode() in marker
    tail = log[marker_end:]
    assert sent.endswith(tail) and len(tail) >= protocol.OUTPUT_TAIL_BYTES
    assert head + output.dropped + len(tail) == len(sent)


def test_a_new_log_never_writes_through_a_planted_link(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    path = tmp_path / "output.log"
    path.symlink_to(precious)
    output, write_fd = BoundedLog.open(path, MIN_MAX_LOG_BYTES)
    output.start()
    os.write(write_fd, b"job output\n")
    os.close(write_fd)
    output.finish(5)
    assert precious.read_text() == "keep me"
    assert not path.is_symlink() and path.read_text() == "job output\n"
