"""Runtime limits: a job that runs past its launch's ``max_runtime_s`` is ended by its node
(SIGTERM to its process group, SIGKILL after ``stop_grace_s``) and reported as timed out.

Real processes; small limits. Timing bounds are loose enough for a loaded 2-core machine.
"""

from __future__ import annotations

import signal
import time

from agents.runner import read_tail

from .helpers import launch, python, status, wait_for

# Slack on top of limit + grace: the runner notices the limit on its next poll, the process takes
# a moment to die, a loaded machine adds some.
SLACK = 2.5


def finish(runner, timeout: float):
    return wait_for(runner.poll, timeout)


def test_a_job_past_its_runtime_limit_is_terminated_and_reported_timed_out(runner):
    cmd = launch(["sleep", "60"], max_runtime_s=1, stop_grace_s=5)
    # Before the launch: the limit counts from the process start, which launch() returns after.
    started = time.monotonic()
    runner.launch(cmd)
    [done] = finish(runner, timeout=1 + SLACK)
    elapsed = time.monotonic() - started
    assert done.timed_out is True and done.exit_code == -signal.SIGTERM
    assert not done.stopped and not done.oom  # nobody asked for it: the limit ended it
    assert 1.0 <= elapsed < 1 + SLACK  # SIGTERM was enough: no waiting for the grace
    assert runner.running() == set()


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(runner):
    cmd = launch(python(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    ), max_runtime_s=2, stop_grace_s=0.5)  # 2 s: time to install its handler on a loaded machine
    runner.launch(cmd)
    started = time.monotonic()
    wait_for(lambda: "ready" in read_tail(runner.job_dir(cmd.job_id) / "output.log"))
    [done] = finish(runner, timeout=2 + 0.5 + SLACK)
    elapsed = time.monotonic() - started
    assert done.timed_out is True and done.exit_code == -signal.SIGKILL
    assert 2.4 <= elapsed < 2 + 0.5 + SLACK  # (the limit counts from the process start, before launch() returned)
    assert done.output_tail == "ready\n"


def test_a_suspended_job_still_counts_wall_clock_time(runner):
    cmd = launch(["sleep", "60"], max_runtime_s=1, stop_grace_s=1)
    pid = runner.launch(cmd)
    assert runner.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == "stopped")
    started = time.monotonic()
    [done] = finish(runner, timeout=1 + 1 + SLACK)
    # Continued so that it could act on SIGTERM: ended by it, not left stopped until SIGKILL.
    assert done.timed_out and done.exit_code == -signal.SIGTERM
    assert time.monotonic() - started < 1 + SLACK


def test_a_job_within_its_limit_is_not_touched(runner):
    cmd = launch(python("import time; time.sleep(0.3); print('on time')"), max_runtime_s=30)
    runner.launch(cmd)
    [done] = finish(runner, timeout=10)
    assert (done.exit_code, done.timed_out, done.output_tail) == (0, False, "on time\n")
