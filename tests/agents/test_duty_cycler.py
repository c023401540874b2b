"""Duty cycles and suspension: real processes sliced with SIGSTOP/SIGCONT (runner period 0.5 s).

Timing assertions are loose on purpose: this must pass on a loaded 2-core machine.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from agents.runner import read_tail
from agents.duty_cycler import DutyCycler

from .helpers import launch, python, status, wait_for

BURN = "print('burning', flush=True)\nwhile True: pass"


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def started(runner, job_id) -> bool:
    return "burning" in read_tail(runner.job_dir(job_id) / "output.log")


def statuses(pid: int, seconds: float, every: float = 0.05) -> set[str]:
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.add(status(pid))
        time.sleep(every)
    return seen


def test_a_throttled_cpu_burner_gets_its_duty_cycle_of_the_time(runner):
    throttled = launch(python(BURN), duty_cycle=0.3)
    free = launch(python(BURN))
    pids = {throttled.job_id: runner.launch(throttled), free.job_id: runner.launch(free)}
    wait_for(lambda: started(runner, throttled.job_id) and started(runner, free.job_id))
    assert runner.duty_cycle(throttled.job_id) == 0.3 and runner.duty_cycle(free.job_id) == 1.0
    before = {job_id: cpu_seconds(pid) for job_id, pid in pids.items()}
    wall = time.monotonic()
    time.sleep(3.0)
    wall = time.monotonic() - wall
    share = {job_id: (cpu_seconds(pid) - before[job_id]) / wall for job_id, pid in pids.items()}
    # Against the unthrottled twin, so that other load on the machine cancels out.
    assert share[throttled.job_id] < 0.5, share
    assert 0.15 < share[throttled.job_id] / share[free.job_id] < 0.55, share


def test_suspend_keeps_a_job_stopped_until_resume_restores_its_duty_cycle(runner):
    cmd = launch(python(BURN), duty_cycle=0.5)
    pid = runner.launch(cmd)
    wait_for(lambda: started(runner, cmd.job_id))
    assert runner.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED)
    spent = cpu_seconds(pid)
    assert statuses(pid, 0.6) == {psutil.STATUS_STOPPED}  # across a slicing period boundary
    assert cpu_seconds(pid) - spent < 0.05
    assert runner.duty_cycle(cmd.job_id) == 0.0
    runner.set_duty_cycle(cmd.job_id, 0.8)  # while suspended: remembered, still stopped
    assert statuses(pid, 0.2) == {psutil.STATUS_STOPPED}
    assert runner.resume(cmd.job_id)
    assert runner.duty_cycle(cmd.job_id) == 0.8
    wait_for(lambda: cpu_seconds(pid) > spent + 0.1)


def test_resumed_unthrottled_job_is_never_stopped_again(runner):
    cmd = launch(python(BURN))
    pid = runner.launch(cmd)
    wait_for(lambda: started(runner, cmd.job_id))
    runner.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED)
    runner.resume(cmd.job_id)
    assert psutil.STATUS_STOPPED not in statuses(pid, 0.4)
    assert runner.duty_cycle(cmd.job_id) == 1.0


def test_raising_the_duty_cycle_to_one_ends_the_slicing(runner):
    cmd = launch(python(BURN), duty_cycle=0.2)
    pid = runner.launch(cmd)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED)  # sliced: stopped most of the time
    runner.set_duty_cycle(cmd.job_id, 1.0)
    assert psutil.STATUS_STOPPED not in statuses(pid, 0.4)


TERM_HANDLER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
def bye(*_):
    print('terminated cleanly', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print('ready', child.pid, flush=True)
while True: time.sleep(0.01)
"""


def test_cancelling_a_suspended_job_delivers_sigterm_and_it_dies(runner):
    cmd = launch(python(TERM_HANDLER), duty_cycle=0.5)
    pid = runner.launch(cmd)
    output = runner.job_dir(cmd.job_id) / "output.log"
    # (the line may be read while the supervisor is still copying it: wait for its end)
    child = int(wait_for(lambda: (text := read_tail(output)).endswith("\n") and text.split()[1:])[0])
    runner.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED and status(child) == psutil.STATUS_STOPPED)
    begun = time.monotonic()
    runner.stop(cmd.job_id, grace_seconds=10)
    [done] = wait_for(runner.poll, timeout=5)
    # The handler ran (SIGCONT followed SIGTERM) long before the grace would have ended in SIGKILL.
    assert time.monotonic() - begun < 5
    assert done.exit_code == 0 and done.stopped and "terminated cleanly" in done.output_tail
    wait_for(lambda: status(child) in ("gone", psutil.STATUS_ZOMBIE))


def test_a_stopped_job_is_killed_by_an_immediate_stop(runner):
    cmd = launch(python(BURN))
    pid = runner.launch(cmd)
    runner.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED)
    runner.stop(cmd.job_id, grace_seconds=0)
    [done] = wait_for(runner.poll, timeout=5)
    assert done.exit_code == -signal.SIGKILL and done.stopped


def test_a_throttled_job_that_exits_is_forgotten(runner):
    cmd = launch(python("import time; time.sleep(0.4)"), duty_cycle=0.5)
    runner.launch(cmd)
    [done] = wait_for(runner.poll, timeout=5)
    assert done.exit_code == 0
    assert runner.duty_cycle(cmd.job_id) == 1.0  # nothing left that could signal a reused pid
    assert not runner.set_duty_cycle(cmd.job_id, 0.5)
    assert not runner.suspend(cmd.job_id) and not runner.resume(cmd.job_id)


def test_throttling_commands_for_unknown_jobs_are_refused(runner):
    assert not runner.set_duty_cycle(424242, 0.5)
    assert not runner.suspend(424242)
    assert not runner.resume(424242)


def test_jobs_report_their_duty_cycle_to_the_backend(runner):
    sliced = launch(python(BURN), duty_cycle=0.25, gpus=[0])
    paused = launch(python(BURN), gpus=[1])
    runner.launch(sliced)
    runner.launch(paused)
    runner.suspend(paused.job_id)
    processes = runner.processes()
    assert processes[sliced.job_id].duty_cycle == 0.25 and processes[sliced.job_id].gpu_indices == (0,)
    assert processes[paused.job_id].duty_cycle == 0.0


def test_closing_the_cycler_continues_what_it_stopped(runner):
    cmd = launch(python(BURN))
    pid = runner.launch(cmd)
    cycler = DutyCycler(0.2)
    cycler.suspend(cmd.job_id, pid)
    wait_for(lambda: status(pid) == psutil.STATUS_STOPPED)
    cycler.close()
    cycler.close()
    wait_for(lambda: status(pid) != psutil.STATUS_STOPPED)


@pytest.mark.parametrize("duty_cycle", [0.0, -0.5, 1.5])
def test_duty_cycle_out_of_range_is_refused(duty_cycle):
    with pytest.raises(ValueError, match="duty cycle"):
        DutyCycler().set_duty_cycle(1, 1, duty_cycle)
