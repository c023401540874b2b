"""The job runner: real child processes, their exit codes, output, environment and stopping."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from agents import protocol
from agents.runner import JobRunner, LaunchError, read_tail

from .helpers import gone, launch, python, wait_for


def finish(runner: JobRunner, timeout: float = 5.0):
    """Poll until at least one job finishes; return the finished jobs."""
    return wait_for(runner.poll, timeout)


def test_exit_codes_are_recorded(runner):
    ok = launch(python("pass"))
    failed = launch(python("raise SystemExit(3)"))
    runner.launch(ok)
    runner.launch(failed)
    finished = {}
    wait_for(lambda: finished.update({f.job_id: f for f in runner.poll()}) or len(finished) == 2)
    assert finished[ok.job_id].exit_code == 0
    assert finished[failed.job_id].exit_code == 3
    assert not finished[ok.job_id].stopped
    assert runner.running() == set()


def test_child_sees_its_gpus_and_job_id_and_output_is_kept(runner):
    cmd = launch(
        python("import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['COLONY_JOB_ID'], os.environ['X'])"),
        gpus=[2, 5],
        env={"X": "from-command", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},  # a job cannot widen its GPUs
    )
    runner.launch(cmd)
    [done] = finish(runner)
    assert done.output_tail == f"2,5 {cmd.job_id} from-command\n"
    assert (runner.job_dir(cmd.job_id) / "output.log").read_text() == done.output_tail


def test_job_runs_in_its_own_directory_and_stderr_is_captured(runner):
    cmd = launch(python("import os, sys; print(os.getcwd()); print('oops', file=sys.stderr)"))
    runner.launch(cmd)
    [done] = finish(runner)
    assert done.output_tail.splitlines() == [str(runner.work_dir(cmd.job_id)), "oops"]


def test_agent_redis_url_is_not_passed_to_jobs(runner, monkeypatch):
    monkeypatch.setenv("COLONY_REDIS_URL", "redis://:secret@control:6379/0")
    monkeypatch.setenv("SOME_SITE_SETTING", "kept")
    runner.pass_env += ("SOME_SITE_*", "COLONY_REDIS_URL")  # passing the Redis URL is never honoured
    runner.launch(launch(python(
        "import os; print(os.environ.get('COLONY_REDIS_URL'), os.environ['SOME_SITE_SETTING'])")))
    [done] = finish(runner)
    assert done.output_tail == "None kept\n"


def test_output_tail_keeps_only_the_last_bytes(runner):
    runner.launch(launch(python("import sys; sys.stdout.write('a' * 20000 + 'é' * 10 + 'END')")))
    [done] = finish(runner)
    assert len(done.output_tail.encode()) <= protocol.OUTPUT_TAIL_BYTES
    assert done.output_tail.endswith("é" * 10 + "END")
    assert "\ufffd" not in done.output_tail


def test_tail_of_binary_output_is_replaced_not_crashed(tmp_path):
    path = tmp_path / "output.log"
    path.write_bytes(b"ok \xff\xfe\n")
    assert read_tail(path) == "ok \ufffd\ufffd\n"
    assert read_tail(tmp_path / "missing.log") == ""


def test_missing_executable_is_a_launch_error(runner, tmp_path):
    with pytest.raises(LaunchError, match="cannot start '/no/such/program'"):
        runner.launch(launch(["/no/such/program", "--flag"]))
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(LaunchError, match="Permission denied"):
        runner.launch(launch([str(script)]))
    assert runner.running() == set()


def test_relaunching_a_running_job_does_not_start_it_twice(runner):
    cmd = launch(python("import time; print('started', flush=True); time.sleep(30)"))
    pid = runner.launch(cmd)
    assert runner.launch(cmd) == pid
    assert runner.running() == {cmd.job_id}
    wait_for(lambda: "started" in read_tail(runner.job_dir(cmd.job_id) / "output.log"))
    runner.stop(cmd.job_id, 5)
    [done] = finish(runner)
    assert done.output_tail == "started\n"  # one process wrote it, once


# A job that starts a grandchild (as data loaders and launchers do) and reports both pids.
FAMILY = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
print(child.pid, flush=True)
time.sleep(60)
"""


def _grandchild_pid(runner, job_id) -> int:
    log = runner.job_dir(job_id) / "output.log"
    return int(wait_for(lambda: read_tail(log).strip()))


def test_stop_kills_the_whole_process_group(runner):
    cmd = launch(python(FAMILY))
    pid = runner.launch(cmd)
    grandchild = _grandchild_pid(runner, cmd.job_id)
    runner.stop(cmd.job_id, grace_seconds=5)
    [done] = finish(runner)
    assert done.stopped is True
    assert done.exit_code == -signal.SIGTERM
    assert gone(pid)
    wait_for(lambda: gone(grandchild), timeout=2)


def test_stop_escalates_to_sigkill_after_the_grace(runner):
    cmd = launch(python(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    ))
    runner.launch(cmd)
    wait_for(lambda: "ready" in read_tail(runner.job_dir(cmd.job_id) / "output.log"))
    started = time.monotonic()
    runner.stop(cmd.job_id, grace_seconds=0.3)
    time.sleep(0.1)
    assert runner.poll() == []  # SIGTERM ignored, still inside the grace
    [done] = finish(runner)
    assert done.exit_code == -signal.SIGKILL and done.stopped
    assert 0.3 <= time.monotonic() - started < 3


def test_stragglers_die_with_the_job(runner):
    # The leader exits at once and leaves a grandchild behind.
    cmd = launch(python(
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']).pid)"
    ))
    runner.launch(cmd)
    [done] = finish(runner)
    assert done.exit_code == 0 and not done.stopped
    grandchild = int(done.output_tail)
    wait_for(lambda: gone(grandchild), timeout=2)


def test_stopping_an_unknown_job_is_a_no_op(runner):
    runner.stop(12345, 1)
    assert runner.poll() == []


def test_stop_all_returns_once_everything_exited(runner):
    stubborn = launch(python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('r', flush=True); time.sleep(60)"))
    polite = launch(python("import time; time.sleep(60)"))
    pids = [runner.launch(stubborn), runner.launch(polite)]
    wait_for(lambda: "r" in read_tail(runner.job_dir(stubborn.job_id) / "output.log"))
    finished = runner.stop_all(grace_seconds=0.3)
    assert {f.job_id: f.exit_code for f in finished} == {stubborn.job_id: -signal.SIGKILL,
                                                          polite.job_id: -signal.SIGTERM}
    assert all(f.stopped for f in finished)
    assert runner.running() == set()
    assert all(gone(pid) for pid in pids)
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


# ---------------------------------------------------------------- orphans of an agent that died


def test_a_new_agent_stops_unsupervised_processes_an_earlier_agent_left_and_reports_them_for_requeue(tmp_path):
    import json
    import subprocess

    from agents.accounts import RunAsPolicy

    # What an agent from before supervisors left: the job's own process and a record of it.
    workdir = tmp_path / "agent"
    job_dir = workdir / "jobs" / "41"
    job_dir.mkdir(parents=True)
    (job_dir / "output.log").write_text("working\n")
    orphan_process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    record = {"pid": orphan_process.pid, "create_time": psutil.Process(orphan_process.pid).create_time(),
              "launch_id": "launch-old"}
    (job_dir / "process.json").write_text(json.dumps(record))
    os.killpg(orphan_process.pid, signal.SIGSTOP)  # a duty cycle may have left it stopped

    fresh = JobRunner(workdir, run_as=RunAsPolicy(allow_root=True))
    started = time.monotonic()
    [orphan] = fresh.recover(grace_seconds=5)
    assert (orphan.job_id, orphan.exit_code, orphan.stopped, orphan.requeue) == (41, None, True, True)
    assert orphan.launch_id == "launch-old"
    assert "agent restarted" in orphan.error and "working" in orphan.output_tail
    assert orphan_process.wait(5) == -signal.SIGTERM  # ended by SIGTERM, not left stopped
    assert time.monotonic() - started < 4
    assert fresh.recover(grace_seconds=5) == []  # its record is gone: nothing is stopped twice
    assert not (job_dir / "process.json").exists() and fresh.running() == set()
    fresh.close()


def test_a_record_whose_pid_now_names_another_process_is_dropped_without_a_signal(tmp_path):
    import json

    from agents.accounts import RunAsPolicy

    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True))
    record = runner.job_dir(7) / "process.json"
    record.parent.mkdir(parents=True)
    # Our own pid with another start time: what a reused pid looks like. Signalling it would end this test.
    record.write_text(json.dumps({"pid": os.getpid(), "create_time": 12345.0}))
    assert runner.stop_orphans(grace_seconds=1) == []
    assert not record.exists()
    runner.close()


def test_a_reported_job_leaves_no_record_once_released(runner):
    cmd = launch(python("pass"))
    runner.launch(cmd)
    assert (runner.job_dir(cmd.job_id) / "process.json").exists()
    finish(runner)
    # Kept while the exit's event is not yet sent: a new agent would report it again.
    runner.release_reported({(cmd.job_id, cmd.command_id)})
    assert (runner.job_dir(cmd.job_id) / "exit.json").exists()
    runner.release_reported(set())
    assert not (runner.job_dir(cmd.job_id) / "process.json").exists()
    assert not (runner.job_dir(cmd.job_id) / "exit.json").exists()
    # Its launch is still known to have run here: a re-send long after is never run again.
    assert not runner.never_started(cmd)
    assert not runner.never_started(launch(python("pass"), job_id=cmd.job_id, command_id="x"))  # (not the one taken)


def test_a_spawn_whose_supervisor_never_started_the_job_counts_as_never_started(runner, tmp_path):
    """An agent killed between writing a launch's spawn record and handing its supervisor the job
    left a launch that never ran, and that a re-send never ran either: the job stayed PLACED for
    ever. Such a spawn is told from one still starting (a process in the job's directory, or a
    record younger than a supervisor has to answer) and from an attempt that ran and ended."""
    import json
    import subprocess
    import sys

    from agents import supervise
    from agents.runner import SUPERVISOR_START_SECONDS

    cmd = launch(python("pass"), job_id=91, command_id="launch-91-1")
    job_dir = runner.job_dir(91)
    job_dir.mkdir(parents=True)
    supervise.write_json_atomically(job_dir / "launch.json", json.loads(cmd.model_dump_json()), mode=0o600)
    supervise.make_lock(job_dir)
    supervise.write_json_atomically(job_dir / "spawned.json", {"launch_id": cmd.command_id}, mode=0o600)
    assert not runner.never_started(cmd)  # (just written: a supervisor may be starting)
    old = time.time() - SUPERVISOR_START_SECONDS - 1
    os.utime(job_dir / "spawned.json", (old, old))
    # A supervisor that took its lock and never wrote the job's records (a full disk, say), made
    # non-dumpable as supervisors are (its working directory unreadable without CAP_SYS_PTRACE).
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               "from agents.hardening import make_non_dumpable; make_non_dumpable(); "
                               "fd = os.open('supervisor.lock', os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
                               "print('held', flush=True); time.sleep(30)"],
                              cwd=job_dir, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline() == b"held\n"
        assert not runner.never_started(cmd)
    finally:
        holder.kill()
        holder.wait()
    assert runner.never_started(cmd)
    assert not runner.never_started(launch(python("pass"), job_id=91, command_id="launch-91-0"))  # (not the one taken)

    runner.launch(cmd)  # it runs, ends and is reported: never taken for a spawn that did not happen
    wait_for(runner.poll)
    runner.release_reported(set())
    assert json.loads((job_dir / "spawned.json").read_text()).get("ended") is True
    os.utime(job_dir / "spawned.json", (old, old))
    assert not runner.never_started(cmd)
