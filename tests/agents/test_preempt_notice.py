"""Preemption notice: a preempting stop first writes the SIGKILL deadline to the job's
``COLONY_PREEMPT_FILE``, then sends the launch's stop signal, then SIGKILL after the grace. Every
stop (and the runtime limit) uses the launch's stop signal; the exit is reported as stopped."""

from __future__ import annotations

import os
import stat
import time

import pytest

from agents import protocol, signing
from agents.accounts import RunAsPolicy, lookup_account
from agents.runner import JobRunner, read_tail

from .helpers import events, launch, python, send_signed, wait_for

KEY = signing.node_key("p" * 32, "n1")

# Checkpoints when told: on SIGUSR1 it reads the deadline and says how long it has, then exits.
CHECKPOINTER = """
import os, signal, sys, time
notice = os.environ["COLONY_PREEMPT_FILE"]
print("notice before:", os.path.exists(notice), flush=True)
def checkpoint(signum, frame):
    deadline = open(notice).read() if os.path.exists(notice) else "none" + chr(10)
    name = signal.Signals(signum).name
    print("signal", name, "deadline", deadline.strip(), "lines", deadline.count(chr(10)), flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM, not my signal", flush=True), sys.exit(9)))
print("ready", flush=True)
time.sleep(60)
"""


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def ready(log_path):
    return lambda: log_path.exists() and "ready" in log_path.read_text()


def test_a_preempted_job_reads_its_deadline_on_its_own_signal_and_is_reported_stopped(
        redis_url, redis_client, start_agent):
    running = start_agent(redis_url, key=KEY)
    cmd = launch(python(CHECKPOINTER), stop_signal="SIGUSR1", attempt=0)
    send_signed(redis_client, "n1", cmd, KEY)
    wait_for(ready(running.agent.runner.job_dir(cmd.job_id) / "output.log"), timeout=10)
    preempt = protocol.StopJob(command_id="preempt-1", job_id=cmd.job_id, grace_seconds=120, preempt=True,
                               launch_id=cmd.command_id)
    sent_at = time.time()
    send_signed(redis_client, "n1", preempt, KEY)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=10)
    assert done.stopped is True and done.exit_code == 0 and not done.requeue
    lines = done.output_tail.splitlines()
    assert lines[:2] == ["notice before: False", "ready"]
    words = lines[2].split()
    assert words[:2] == ["signal", "SIGUSR1"] and words[-2:] == ["lines", "1"]
    assert sent_at + 120 - 5 <= int(words[3]) <= time.time() + 120  # unix seconds of the SIGKILL deadline
    notice = running.agent.runner.preempt_file(cmd.job_id)
    assert stat.S_IMODE(notice.stat().st_mode) == 0o640


def test_an_ordinary_stop_sends_the_launchs_signal_and_writes_no_notice(runner):
    cmd = launch(python(CHECKPOINTER), stop_signal="SIGUSR1")
    runner.launch(cmd)
    wait_for(ready(runner.job_dir(cmd.job_id) / "output.log"), timeout=10)
    runner.stop(cmd.job_id, grace_seconds=10)
    [done] = wait_for(runner.poll, 10)
    assert done.stopped and done.exit_code == 0
    assert done.output_tail.splitlines()[-1] == "signal SIGUSR1 deadline none lines 1"
    assert not runner.preempt_file(cmd.job_id).exists()


def test_a_job_that_ignores_the_notice_is_killed_after_the_grace(runner):
    cmd = launch(python("import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
                        "print('ready', flush=True); time.sleep(60)"), stop_signal="SIGUSR2")
    runner.launch(cmd)
    wait_for(ready(runner.job_dir(cmd.job_id) / "output.log"), timeout=10)
    started = time.monotonic()
    runner.stop(cmd.job_id, grace_seconds=0.5, preempt=True)
    [done] = wait_for(runner.poll, 10)
    assert done.stopped and done.exit_code == -9 and 0.5 <= time.monotonic() - started < 5
    assert runner.preempt_file(cmd.job_id).read_text().count("\n") == 1


def test_the_runtime_limit_uses_the_launchs_stop_signal(runner):
    cmd = launch(python("import time\ntry:\n    print('ready', flush=True); time.sleep(60)\n"
                        "except KeyboardInterrupt:\n    print('interrupted')"),
                 stop_signal="SIGINT", max_runtime_s=1, stop_grace_s=5)
    runner.launch(cmd)
    [done] = wait_for(runner.poll, 8)
    assert done.timed_out and done.exit_code == 0 and done.output_tail == "ready\ninterrupted\n"


def test_an_adopted_job_is_preempted_with_its_own_signal_and_a_new_attempt_starts_without_a_notice(tmp_path):
    workdir = tmp_path / "agent"
    dead = JobRunner(workdir, run_as=RunAsPolicy(allow_root=True))
    cmd = launch(python(CHECKPOINTER), stop_signal="SIGUSR1", attempt=0, array_id=2, array_index=5)
    dead.launch(cmd)
    wait_for(ready(dead.job_dir(cmd.job_id) / "output.log"), timeout=10)
    dead._cycler.close()  # the agent dies; its job runs on under its supervisor
    fresh = JobRunner(workdir, run_as=RunAsPolicy(allow_root=True))
    try:
        assert fresh.recover(grace_seconds=5) == []
        fresh.stop(cmd.job_id, grace_seconds=60, preempt=True)
        [done] = wait_for(fresh.poll, 10)
        assert done.stopped and done.exit_code == 0 and "signal SIGUSR1 deadline" in done.output_tail
        # The next attempt must not find the last one's notice.
        again = cmd.model_copy(update={"command_id": "launch-again", "attempt": 1})
        fresh.launch(again)
        wait_for(lambda: "ready" in read_tail(fresh.job_dir(cmd.job_id) / "output.log"), timeout=10)
        assert "notice before: False" in read_tail(fresh.job_dir(cmd.job_id) / "output.log")
    finally:
        fresh.stop_all(0)
        fresh.close()


def test_the_notice_is_readable_by_the_jobs_account_only(passable_tmp_path):
    tmp_path = passable_tmp_path
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    nobody = lookup_account("nobody")
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(default=nobody, agent_uid=0))
    cmd = launch(["sleep", "30"])
    try:
        runner.launch(cmd)
        runner.stop(cmd.job_id, grace_seconds=5, preempt=True)
        notice = runner.preempt_file(cmd.job_id)
        info, folder = notice.stat(), notice.parent.stat()
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (nobody.gid, 0o640)
        assert (folder.st_gid, stat.S_IMODE(folder.st_mode) & 0o777) == (nobody.gid, 0o750)
    finally:
        runner.stop_all(0)
        runner.close()
