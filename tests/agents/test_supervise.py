"""Jobs survive their agent: each job runs under its own supervisor process, which writes its
output and its exit to files, so a new agent adopts a job the last one left running (no requeue,
no second run) and reports a job that ended while no agent ran with its real exit code.

Real processes throughout; the last tests kill a real ``python -m agents`` with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agents.accounts import RunAsPolicy
from agents.runner import JobRunner, read_tail

from .helpers import events, launch, python, send, status, stop, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_runner(tmp_path):
    """``make_runner()`` -> a JobRunner on one workdir; every one made shares it, like agents
    started one after another on a node. Whatever still runs is stopped at the end."""
    made: list[JobRunner] = []

    def make() -> JobRunner:
        made.append(JobRunner(tmp_path / "agent", duty_period=0.5, run_as=RunAsPolicy(allow_root=True)))
        return made[-1]

    yield make
    last = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True))
    last.recover(0)
    last.stop_all(0)
    last.close()
    for runner in made:
        runner.close()


def die(runner: JobRunner) -> None:
    """What an agent's SIGKILL leaves: its threads gone, its jobs' supervisors running on."""
    runner._cycler.close()


def finish(runner: JobRunner, timeout: float = 10.0):
    return wait_for(runner.poll, timeout)


def test_the_job_runs_under_a_supervisor_in_a_session_of_its_own(make_runner):
    runner = make_runner()
    cmd = launch(python("import time; print('working', flush=True); time.sleep(30)"))
    pid = runner.launch(cmd)
    job = psutil.Process(pid)
    supervisor = job.parent()
    assert supervisor.pid != os.getpid() and supervisor.parent().pid == os.getpid()
    # Neither the job nor its supervisor is in the agent's session or process group: a killpg of
    # the agent's group (the dev stack stopping it) or its death reaches neither.
    assert os.getsid(supervisor.pid) == supervisor.pid and os.getsid(pid) == pid
    assert os.getpgid(pid) == pid and os.getsid(0) not in (supervisor.pid, pid)
    wait_for(lambda: "working" in read_tail(runner.job_dir(cmd.job_id) / "output.log"))
    runner.stop(cmd.job_id, 5)
    [done] = finish(runner)
    assert (done.exit_code, done.stopped, done.output_tail) == (-signal.SIGTERM, True, "working\n")
    wait_for(lambda: not psutil.pid_exists(supervisor.pid) or status(supervisor.pid) == "zombie")


def test_a_new_agent_adopts_a_running_job_and_reports_its_exit_when_it_ends(make_runner):
    dead = make_runner()
    cmd = launch(["sh", "-c", "echo started; sleep 2; echo done"])
    pid = dead.launch(cmd)
    die(dead)

    fresh = make_runner()
    assert fresh.recover(grace_seconds=5) == []  # nothing stopped, nothing to requeue
    assert fresh.running() == {cmd.job_id}
    assert fresh.processes()[cmd.job_id].pid == pid
    assert psutil.Process(pid).is_running()  # the same process, never restarted
    [done] = finish(fresh, timeout=10)
    assert (done.job_id, done.exit_code, done.stopped, done.requeue, done.launch_id) == (
        cmd.job_id, 0, False, False, cmd.command_id)
    assert done.output_tail == "started\ndone\n"  # written by its supervisor while no agent read it
    assert fresh.running() == set() and fresh.recover(5) == []  # reported once


def test_a_job_that_ended_while_no_agent_ran_is_reported_with_its_real_exit(make_runner):
    dead = make_runner()
    cmd = launch(["sh", "-c", "echo bye; exit 7"])
    dead.launch(cmd)
    die(dead)
    wait_for(lambda: (dead.job_dir(cmd.job_id) / "exit.json").exists())

    fresh = make_runner()
    [done] = fresh.recover(grace_seconds=5)
    assert (done.job_id, done.exit_code, done.stopped, done.requeue, done.launch_id) == (
        cmd.job_id, 7, False, False, cmd.command_id)
    assert done.output_tail == "bye\n"
    assert fresh.running() == set() and fresh.recover(5) == []


def test_an_adopted_job_can_be_throttled_suspended_and_stopped(make_runner):
    dead = make_runner()
    cmd = launch(python("print('burning', flush=True)\nwhile True: pass"))
    pid = dead.launch(cmd)
    dead.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == "stopped")
    die(dead)

    fresh = make_runner()
    assert fresh.recover(grace_seconds=5) == []
    wait_for(lambda: status(pid) != "stopped")  # continued on adoption: never left stopped for good
    assert fresh.suspend(cmd.job_id)
    wait_for(lambda: status(pid) == "stopped")
    assert fresh.resume(cmd.job_id)
    wait_for(lambda: status(pid) != "stopped")
    assert fresh.set_duty_cycle(cmd.job_id, 0.3)
    seen = set()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        seen.add(status(pid))
        time.sleep(0.05)
    assert "stopped" in seen and seen & {"running", "sleeping"}  # sliced
    fresh.stop(cmd.job_id, 5)
    [done] = finish(fresh)
    assert (done.exit_code, done.stopped, done.requeue) == (-signal.SIGTERM, True, False)


def test_an_adopted_job_keeps_its_runtime_limit(make_runner):
    dead = make_runner()
    cmd = launch(["sleep", "60"], max_runtime_s=2, stop_grace_s=1)
    dead.launch(cmd)
    die(dead)
    fresh = make_runner()
    assert fresh.recover(grace_seconds=5) == []
    [done] = finish(fresh, timeout=2 + 1 + 3)
    assert (done.exit_code, done.timed_out) == (-signal.SIGTERM, True)


def test_a_job_whose_supervisor_died_is_stopped_and_reported_for_requeue(make_runner):
    dead = make_runner()
    cmd = launch(python("import time; print('working', flush=True); time.sleep(60)"))
    pid = dead.launch(cmd)
    wait_for(lambda: "working" in read_tail(dead.job_dir(cmd.job_id) / "output.log"))
    supervisor = psutil.Process(pid).parent()
    die(dead)
    supervisor.kill()  # e.g. the kernel's OOM killer
    wait_for(lambda: status(supervisor.pid) in ("gone", "zombie"))

    fresh = make_runner()
    [orphan] = fresh.recover(grace_seconds=5)
    assert (orphan.job_id, orphan.exit_code, orphan.stopped, orphan.requeue) == (cmd.job_id, None, True, True)
    assert "working" in orphan.output_tail
    wait_for(lambda: status(pid) in ("gone", "zombie"))  # never left to run beside its next attempt


def test_a_supervisor_dying_under_a_running_agent_is_noticed(make_runner):
    runner = make_runner()
    cmd = launch(["sleep", "60"])
    pid = runner.launch(cmd)
    psutil.Process(pid).parent().kill()
    [done] = finish(runner)
    assert (done.exit_code, done.requeue) == (None, True) and "supervisor" in done.error
    wait_for(lambda: status(pid) in ("gone", "zombie"))


def test_a_launch_the_supervisor_cannot_start_is_a_launch_error(make_runner):
    from agents.runner import LaunchError

    runner = make_runner()
    with pytest.raises(LaunchError, match="cannot start '/no/such/program'"):
        runner.launch(launch(["/no/such/program"]))
    assert runner.running() == set()


# ---------------------------------------------------------------- a real agent killed with SIGKILL


def start_agent_process(redis_url: str, workdir: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agents", "--node", "n1", "--simulate", "1xT4-16GB", "--redis", redis_url,
             "--interval", "0.2", "--workdir", str(workdir), "--allow-root-jobs"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # as the dev stack and compose run it: its own process group
        )


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


@pytest.fixture
def agent_processes(tmp_path):
    started: list[subprocess.Popen] = []
    log = tmp_path / "agent.log"

    def start(redis_url: str) -> subprocess.Popen:
        started.append(start_agent_process(redis_url, tmp_path / "work", log))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    # Jobs an agent killed by the test left running.
    cleanup = JobRunner(tmp_path / "work", run_as=RunAsPolicy(allow_root=True))
    cleanup.recover(0)
    cleanup.stop_all(0)
    cleanup.close()
    if any(process.returncode not in (0, -signal.SIGKILL) for process in started):
        print(log.read_text()[-5000:])


def test_a_sigkilled_agents_jobs_are_adopted_by_the_next_agent_and_run_once(redis_url, redis_client,
                                                                            agent_processes, tmp_path):
    first = agent_processes(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"), timeout=20)
    marks = tmp_path / "runs.txt"
    long_job = launch(["sh", "-c", f"echo run >> {marks}; echo started; sleep 3; echo done"])
    quick_job = launch(["sh", "-c", "sleep 0.5; echo quick; exit 3"])
    send(redis_client, "n1", long_job)
    send(redis_client, "n1", quick_job)
    wait_for(lambda: len(events(redis_client, "job_started")) == 2, timeout=10)
    long_pid = next(e.pid for e in events(redis_client, "job_started") if e.job_id == long_job.job_id)

    killed_at = time.monotonic()
    os.killpg(first.pid, signal.SIGKILL)  # the agent's whole process group: supervisors are not in it
    first.wait()
    assert psutil.Process(long_pid).is_running()
    time.sleep(1.0)  # the quick job ends while no agent runs

    agent_processes(redis_url)
    wait_for(lambda: len(events(redis_client, "node_registered")) == 2, timeout=20)
    registered = events(redis_client, "node_registered")[-1]
    quick_done = wait_for(lambda: exited(redis_client, quick_job.job_id), timeout=10)
    [long_done] = wait_for(lambda: exited(redis_client, long_job.job_id), timeout=15)
    adopted_in = time.monotonic() - killed_at

    assert [(e.exit_code, e.requeue, e.launch_id) for e in quick_done] == [(3, False, quick_job.command_id)]
    assert quick_done[0].output_tail == "quick\n"
    assert long_job.job_id in registered.running_jobs  # reported as running by the new agent
    assert (long_done.exit_code, long_done.stopped, long_done.requeue, long_done.launch_id) == (
        0, False, False, long_job.command_id)
    assert long_done.output_tail == "started\ndone\n"
    assert marks.read_text() == "run\n"  # ran once: adopted, not restarted
    assert len([e for e in events(redis_client, "job_started") if e.job_id == long_job.job_id]) == 1
    print(f"adopted job reported done {adopted_in:.1f}s after the agent was killed")


def test_an_adopted_job_is_stopped_by_the_new_agent_on_command(redis_url, redis_client, agent_processes):
    first = agent_processes(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"), timeout=20)
    job = launch(python("import time; print('working', flush=True); time.sleep(60)"))
    send(redis_client, "n1", job)
    wait_for(lambda: events(redis_client, "job_started"), timeout=10)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    second = agent_processes(redis_url)
    wait_for(lambda: len(events(redis_client, "node_registered")) == 2, timeout=20)
    send(redis_client, "n1", stop(job.job_id, grace=5))
    [done] = wait_for(lambda: exited(redis_client, job.job_id), timeout=10)
    assert (done.exit_code, done.stopped) == (-signal.SIGTERM, True) and done.output_tail == "working\n"
    second.terminate()
    assert second.wait(15) == 0


def test_a_clean_shutdown_of_the_agents_process_group_still_stops_its_jobs(redis_url, redis_client, agent_processes):
    agent = agent_processes(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"), timeout=20)
    job = launch(["sleep", "60"])
    send(redis_client, "n1", job)
    [job_started] = wait_for(lambda: events(redis_client, "job_started"), timeout=10)
    supervisor = psutil.Process(job_started.pid).parent()
    os.killpg(agent.pid, signal.SIGTERM)  # how the dev stack and the e2e stack stop an agent
    assert agent.wait(15) == 0
    [done] = exited(redis_client, job.job_id)
    assert (done.exit_code, done.stopped, done.requeue) == (-signal.SIGTERM, True, True)
    assert status(job_started.pid) in ("gone", "zombie")
    wait_for(lambda: status(supervisor.pid) in ("gone", "zombie"))  # it exits once its job has


def test_an_exit_not_yet_sent_when_the_agent_is_killed_is_reported_by_the_next_agent(tmp_path, agent_processes):
    from cluster_ui.devstack.redis_server import PrivateRedis

    import redis as redis_lib

    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        first = agent_processes(server.url)
        wait_for(lambda: events(client, "node_registered"), timeout=20)
        job = launch(["sh", "-c", "sleep 1; echo finished offline; exit 4"])
        send(client, "n1", job)
        wait_for(lambda: events(client, "job_started"), timeout=10)
        port = server.port
        server.stop()  # the exit happens while Redis is away: it waits in the agent's memory...
        time.sleep(2.5)
        os.kill(first.pid, signal.SIGKILL)  # ...which dies with the agent
        first.wait()
        with PrivateRedis(tmp_path / "redis", port=port) as server:
            client = redis_lib.Redis.from_url(server.url)
            agent_processes(server.url)
            [done] = wait_for(lambda: exited(client, job.job_id), timeout=20)
            assert (done.exit_code, done.requeue, done.launch_id) == (4, False, job.command_id)
            assert done.output_tail == "finished offline\n"
            client.close()


def test_the_job_starts_with_default_signal_handling(make_runner):
    # Whatever its supervisor does, the job must be able to get Ctrl-C/SIGHUP/SIGTERM like any program.
    runner = make_runner()
    cmd = launch(python("import signal; print([signal.getsignal(s) is signal.default_int_handler if s == signal.SIGINT "
                        "else signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGINT, signal.SIGHUP, "
                        "signal.SIGTERM, signal.SIGUSR1)])"))
    runner.launch(cmd)
    [done] = finish(runner)
    assert done.output_tail == "[True, True, True, True]\n"


def test_a_supervised_job_whose_launch_record_is_lost_is_stopped_not_left_unmanaged(make_runner):
    dead = make_runner()
    cmd = launch(["sleep", "60"])
    pid = dead.launch(cmd)
    die(dead)
    (dead.job_dir(cmd.job_id) / "launch.json").unlink()  # e.g. a disk error: it cannot be adopted

    fresh = make_runner()
    [orphan] = fresh.recover(grace_seconds=5)
    assert (orphan.job_id, orphan.requeue, orphan.launch_id) == (cmd.job_id, True, cmd.command_id)
    wait_for(lambda: status(pid) in ("gone", "zombie"))


def test_a_job_recorded_after_recover_looked_is_adopted_when_its_attempt_is_asked_after(make_runner):
    """``recover`` ran before the supervisor wrote the job's record; ``adopt_late``, called when the
    control plane asks after that attempt, takes it over (or reports its exit if it ended)."""
    dead = make_runner()
    running = launch(["sh", "-c", "echo started; sleep 2; echo done"], duty_cycle=0.5)
    ended = launch(["sh", "-c", "echo bye; exit 4"])
    pid = dead.launch(running)
    dead.launch(ended)
    die(dead)
    wait_for(lambda: (dead.job_dir(ended.job_id) / "exit.json").exists())
    records = {cmd.job_id: (dead.job_dir(cmd.job_id) / "process.json") for cmd in (running, ended)}
    written = {job_id: path.read_bytes() for job_id, path in records.items()}
    for path in records.values():
        path.unlink()

    fresh = make_runner()
    assert fresh.recover(grace_seconds=5) == [] and fresh.running() == set()  # (nothing seen)
    for job_id, path in records.items():
        path.write_bytes(written[job_id])
    assert fresh.adopt_late(running.job_id, "another-attempt", 5) == [] and fresh.running() == set()
    assert fresh.adopt_late(running.job_id, running.command_id, 5) == []
    assert fresh.running() == {running.job_id} and fresh.processes()[running.job_id].pid == pid
    assert fresh.duty_cycle(running.job_id) == 0.5  # as launched (the earlier agent may never have set it)
    assert fresh.adopt_late(running.job_id, running.command_id, 5) == []  # (once)
    [bye] = fresh.adopt_late(ended.job_id, ended.command_id, 5)
    assert (bye.job_id, bye.exit_code, bye.output_tail, bye.requeue) == (ended.job_id, 4, "bye\n", False)
    [done] = finish(fresh, timeout=10)
    assert (done.job_id, done.exit_code, done.output_tail) == (running.job_id, 0, "started\ndone\n")


def test_a_supervisor_holds_its_lock_for_life_and_an_attempt_stopped_by_a_new_agent_is_never_run_again(
        make_runner):
    """The lock is how a new agent tells a spawn that never happened from a supervisor alive; and
    an attempt whose supervisor died while no agent ran (a reboot, the OOM killer) ran: once the
    next agent has settled it, a re-send of its launch is answered, never run again (review)."""
    from agents import supervise
    from agents.runner import SUPERVISOR_START_SECONDS

    dead = make_runner()
    cmd = launch(["sleep", "60"])
    dead.launch(cmd)
    job_dir = dead.job_dir(cmd.job_id)
    assert supervise.lock_held(job_dir)
    record = json.loads((job_dir / "process.json").read_text())
    die(dead)
    os.kill(record["supervisor_pid"], signal.SIGKILL)
    os.killpg(record["pid"], signal.SIGKILL)
    wait_for(lambda: not supervise.lock_held(job_dir))
    old = time.time() - SUPERVISOR_START_SECONDS - 1
    os.utime(job_dir / "spawned.json", (old, old))

    fresh = make_runner()
    [gone_job] = fresh.recover(grace_seconds=1)
    assert (gone_job.job_id, gone_job.requeue) == (cmd.job_id, True)
    assert not (job_dir / "process.json").exists()
    assert not fresh.never_started(cmd)
