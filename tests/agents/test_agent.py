"""The agent loop against a real Redis: registration, heartbeats, commands, events, outages."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis as redis_lib

from agents import protocol
from cluster_ui.devstack.redis_server import PrivateRedis

from .helpers import events, gone, launch, python, send, stop, wait_for

SLEEPER = "import time; print('working', flush=True); time.sleep(60)"


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def started(client, job_id):
    return [e for e in events(client, "job_started") if e.job_id == job_id]


def test_agent_registers_its_gpus(redis_url, redis_client, start_agent):
    start_agent(redis_url, node="gpu-01", spec="4xV100-32GB,2xT4-16GB")
    [registered] = wait_for(lambda: events(redis_client, "node_registered"))
    assert registered.node == "gpu-01"
    assert registered.backend == "simulated"
    assert len(registered.gpus) == 6
    assert registered.gpus[5].model == "T4-16GB"
    # The command group exists from the start, so commands sent before the first read are kept.
    stream = protocol.command_stream("gpu-01")
    wait_for(lambda: redis_client.exists(stream))
    groups = redis_client.xinfo_groups(stream)
    assert [g["name"] for g in groups] == [protocol.AGENT_COMMAND_GROUP.encode()]


def test_heartbeat_key_is_refreshed_with_a_ttl(redis_url, redis_client, start_agent):
    start_agent(redis_url, heartbeat_ttl=3)
    key = protocol.heartbeat_key("n1")
    wait_for(lambda: redis_client.exists(key))
    assert 0 < redis_client.ttl(key) <= 3
    first = json.loads(redis_client.get(key))
    assert first["running"] == []
    wait_for(lambda: json.loads(redis_client.get(key))["ts"] > first["ts"])


def test_launched_job_reports_started_then_exited_with_output(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    cmd = launch(python("import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); raise SystemExit(3)"), gpus=[1])
    send(redis_client, "n1", cmd)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
    assert done.exit_code == 3 and not done.stopped and done.error is None
    assert done.output_tail == "gpus 1\n"
    kinds = [(e.kind, getattr(e, "job_id", None)) for e in events(redis_client)]
    assert kinds.index(("job_started", cmd.job_id)) < kinds.index(("job_exited", cmd.job_id))
    # Applied commands are acked: nothing stays pending for the agent.
    assert redis_client.xpending(protocol.command_stream("n1"), protocol.AGENT_COMMAND_GROUP)["pending"] == 0


def test_same_command_delivered_twice_runs_once(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    cmd = launch(python("print('ran')"))
    send(redis_client, "n1", cmd)
    send(redis_client, "n1", cmd)
    # A different command for the same job (e.g. a retried publish) must not rerun it either.
    send(redis_client, "n1", cmd.model_copy(update={"command_id": "another-id"}))
    wait_for(lambda: exited(redis_client, cmd.job_id))
    marker = launch(python("pass"))  # commands are applied in order: once this ends, all were read
    send(redis_client, "n1", marker)
    wait_for(lambda: exited(redis_client, marker.job_id))
    assert len(started(redis_client, cmd.job_id)) == 1
    assert len(exited(redis_client, cmd.job_id)) == 1


def test_stop_command_ends_a_sleeping_job(redis_url, redis_client, start_agent):
    agent = start_agent(redis_url)
    cmd = launch(python(SLEEPER))
    send(redis_client, "n1", cmd)
    wait_for(lambda: started(redis_client, cmd.job_id))
    wait_for(lambda: cmd.job_id in json.loads(redis_client.get(protocol.heartbeat_key("n1")) or "{}")
             .get("running", []))
    log = agent.agent.runner.job_dir(cmd.job_id) / "output.log"
    wait_for(lambda: log.exists() and "working" in log.read_text())  # a loaded machine starts Python slowly
    send(redis_client, "n1", stop(cmd.job_id, grace=5))
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
    assert done.stopped is True
    assert done.exit_code == -signal.SIGTERM
    assert done.output_tail == "working\n"


def test_a_stop_for_a_job_not_running_here_is_answered_so_the_job_is_not_stuck_stopping(redis_url, redis_client,
                                                                                       start_agent):
    start_agent(redis_url)
    send(redis_client, "n1", stop(4242, grace=1))  # e.g. its launch was lost
    [done] = wait_for(lambda: exited(redis_client, 4242))
    assert (done.exit_code, done.stopped, done.absent) == (None, True, True) and "not running" in done.error


def test_job_that_cannot_start_is_reported_with_the_error(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    missing = launch(["/no/such/program"])
    wrong_gpu = launch(python("pass"), gpus=[0, 7])  # the node has GPUs 0 and 1
    send(redis_client, "n1", missing)
    send(redis_client, "n1", wrong_gpu)
    [done] = wait_for(lambda: exited(redis_client, missing.job_id))
    assert done.exit_code is None and "/no/such/program" in done.error
    [done] = wait_for(lambda: exited(redis_client, wrong_gpu.job_id))
    assert done.exit_code is None and "GPU index [7] not on node n1" in done.error
    assert started(redis_client, missing.job_id) == []


def test_garbage_command_is_dead_lettered_and_the_agent_carries_on(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    stream = protocol.command_stream("n1")
    wait_for(lambda: events(redis_client, "node_registered"))
    garbage_id = redis_client.xadd(stream, {"m": json.dumps({"v": 1, "kind": "reboot"})})
    redis_client.xadd(stream, {"m": b"\xff" * 5000})
    cmd = launch(python("print('still here')"))
    send(redis_client, "n1", cmd)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
    assert done.output_tail == "still here\n"
    # Refused on the agent's own events stream (the control plane dead-letters them).
    first, second = events(redis_client, "command_rejected")
    assert first.entry_id == garbage_id.decode() and "'reboot'" in first.reason
    assert second.reason == "message is not UTF-8"
    assert "raw" not in first.model_dump()  # no excerpt of a command entry ever travels
    assert redis_client.xpending(stream, protocol.AGENT_COMMAND_GROUP)["pending"] == 0


def test_command_that_breaks_the_agent_is_dead_lettered(redis_url, redis_client, start_agent):
    running = start_agent(redis_url)
    real_launch = running.agent.runner.launch

    def broken_launch(cmd, **options):
        if cmd.argv[-1] == "poison":
            raise RuntimeError("bug in the runner")
        return real_launch(cmd, **options)

    running.agent.runner.launch = broken_launch
    send(redis_client, "n1", launch(python("pass") + ["poison"]))
    cmd = launch(python("print('next')"))
    send(redis_client, "n1", cmd)
    wait_for(lambda: exited(redis_client, cmd.job_id))
    [refusal] = events(redis_client, "command_rejected")
    assert "bug in the runner" in refusal.reason
    running.stop()


def test_unacked_commands_are_applied_after_an_agent_restart(redis_url, redis_client, start_agent):
    # A previous run of this agent read a command and died before applying and acking it.
    stream = protocol.command_stream("n1")
    redis_client.xgroup_create(stream, protocol.AGENT_COMMAND_GROUP, id="0", mkstream=True)
    cmd = launch(python("print('recovered')"))
    send(redis_client, "n1", cmd)
    redis_client.xreadgroup(protocol.AGENT_COMMAND_GROUP, "n1", {stream: ">"})
    start_agent(redis_url)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id))
    assert done.output_tail == "recovered\n"


def test_shutdown_stops_running_jobs_and_reports_them(redis_url, redis_client, start_agent):
    agent = start_agent(redis_url)
    cmd = launch(python(SLEEPER))
    send(redis_client, "n1", cmd)
    wait_for(lambda: started(redis_client, cmd.job_id))
    agent.stop()
    [done] = exited(redis_client, cmd.job_id)
    assert done.stopped and done.exit_code == -signal.SIGTERM
    assert done.requeue  # the agent went away, the job did not fail: the control plane requeues it


def test_a_job_that_ended_by_itself_before_shutdown_is_not_requeued(redis_url, redis_client, start_agent):
    agent = start_agent(redis_url)
    cmd = launch(python("print('quick')"))
    send(redis_client, "n1", cmd)
    wait_for(lambda: started(redis_client, cmd.job_id))
    time.sleep(0.5)  # exited, perhaps not yet reaped by the agent's loop
    agent.stop()
    [done] = exited(redis_client, cmd.job_id)
    assert (done.exit_code, done.stopped, done.requeue) == (0, False, False)


def test_exits_redis_took_just_before_it_restarted_are_sent_again(tmp_path, start_agent):
    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        start_agent(server.url)
        cmd = launch(python("print('quick')"))
        send(client, "n1", cmd)
        [first] = wait_for(lambda: exited(client, cmd.job_id))  # in Redis, maybe never read by anyone...
        server.restart()  # ...and gone with it
        client = redis_lib.Redis.from_url(server.url)
        [again] = wait_for(lambda: exited(client, cmd.job_id), timeout=10)
        assert again == first and again.launch_id == cmd.command_id
        kinds = [e.kind for e in events(client)]
        assert kinds.index("node_registered") < kinds.index("job_exited")


def test_agent_survives_a_redis_restart(tmp_path, start_agent):
    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        agent = start_agent(server.url)
        cmd = launch(python("import time; print('working', flush=True); time.sleep(1.5); print('done')"))
        send(client, "n1", cmd)
        [job_started] = wait_for(lambda: started(client, cmd.job_id))

        server.restart()  # everything in Redis is lost, as after a real crash
        client = redis_lib.Redis.from_url(server.url)
        wait_for(lambda: events(client, "node_registered"), timeout=5)  # registered again
        [done] = wait_for(lambda: exited(client, cmd.job_id), timeout=5)
        assert done.exit_code == 0
        assert done.output_tail == "working\ndone\n"  # the job kept running through the outage
        kinds = [e.kind for e in events(client)]
        assert kinds.index("node_registered") < kinds.index("job_exited")

        # Its command stream and group are back, so it takes new work.
        again = launch(python("print('after')"))
        send(client, "n1", again)
        wait_for(lambda: exited(client, again.job_id), timeout=5)
        assert agent.agent.connected
        client.close()


def test_events_are_buffered_while_redis_is_down(tmp_path, start_agent):
    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        agent = start_agent(server.url)
        cmd = launch(python("import time; time.sleep(0.5); print('finished offline')"))
        send(client, "n1", cmd)
        [job_started] = wait_for(lambda: started(client, cmd.job_id))
        client.close()
        port = server.port
        server.stop()  # down, not restarted yet: the exit happens while nobody listens

        wait_for(lambda: agent.agent.buffered_events == 1)  # the exit, waiting in the outbox
        assert not agent.agent.connected
        assert gone(job_started.pid)

        with PrivateRedis(tmp_path / "redis", port=port) as server:
            client = redis_lib.Redis.from_url(server.url)
            [done] = wait_for(lambda: exited(client, cmd.job_id), timeout=8)
            assert done.exit_code == 0 and done.output_tail == "finished offline\n"
            # Registration first, then the buffered events in the order they happened.
            assert [e.kind for e in events(client)] == ["node_registered", "job_exited"]
            # (an event leaves the outbox once Redis has it: just after it shows in the stream)
            wait_for(lambda: agent.agent.buffered_events == 0)
            assert agent.agent.dropped_events == 0
            agent.stop()
            client.close()


def test_a_job_past_its_runtime_limit_is_reported_timed_out(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    cmd = launch(["sleep", "60"], max_runtime_s=1, stop_grace_s=2)
    send(redis_client, "n1", cmd)
    [job_started] = wait_for(lambda: started(redis_client, cmd.job_id))
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=6)
    assert (done.timed_out, done.exit_code, done.stopped, done.requeue) == (True, -signal.SIGTERM, False, False)
    assert done.launch_id == cmd.command_id
    # JobStarted is stamped once the supervisor has answered, a moment after the process started.
    assert 0.8 <= done.finished_at - job_started.started_at < 4.5
    assert gone(job_started.pid)


def test_a_stop_for_an_earlier_attempt_leaves_the_running_one_alone(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    job_id = 4242
    send(redis_client, "n1", launch(python("import time; time.sleep(30)"), job_id=job_id,
                                    command_id=f"launch-{job_id}-2"))
    wait_for(lambda: started(redis_client, job_id))
    send(redis_client, "n1", stop(job_id, grace=1, command_id="stop-old")
         .model_copy(update={"launch_id": f"launch-{job_id}-1"}))
    [answer] = wait_for(lambda: exited(redis_client, job_id))
    assert (answer.absent, answer.launch_id) == (True, f"launch-{job_id}-1")  # not the run it names
    time.sleep(0.5)
    assert len(exited(redis_client, job_id)) == 1  # attempt 2 still runs
    send(redis_client, "n1", stop(job_id, grace=1).model_copy(update={"launch_id": f"launch-{job_id}-2"}))
    ended = wait_for(lambda: [e for e in exited(redis_client, job_id) if not e.absent])
    assert ended[0].launch_id == f"launch-{job_id}-2" and ended[0].stopped


def test_a_stop_for_an_attempt_that_ended_here_reports_its_exit_again(redis_url, redis_client, start_agent):
    """How the control plane recovers an exit lost with a trimmed stream or a Redis restart."""
    start_agent(redis_url)
    cmd = launch(python("print('finished')"))
    send(redis_client, "n1", cmd)
    [first] = wait_for(lambda: exited(redis_client, cmd.job_id))
    send(redis_client, "n1", stop(cmd.job_id).model_copy(update={"launch_id": cmd.command_id}))
    again = wait_for(lambda: exited(redis_client, cmd.job_id)[1:])[0]
    assert again == first and again.exit_code == 0 and again.output_tail == "finished\n"


def test_a_new_agent_does_not_run_again_an_attempt_that_ran_here(redis_url, redis_client, start_agent, tmp_path):
    """After an agent restart, the control plane's re-send of a launch whose reports were lost
    (or a replay of it) must not run the attempt a second time."""
    runs = tmp_path / "runs.txt"
    first_agent = start_agent(redis_url)
    cmd = launch(python(f"open({str(runs)!r}, 'a').write('run\\n')"), attempt=1, command_id="launch-77-1", job_id=77)
    send(redis_client, "n1", cmd)
    wait_for(lambda: exited(redis_client, 77))
    first_agent.stop()

    start_agent(redis_url)  # same node, same work directory
    wait_for(lambda: len(events(redis_client, "node_registered")) == 2)
    send(redis_client, "n1", cmd)  # the same launch, re-sent
    send(redis_client, "n1", launch(cmd.argv, job_id=77, attempt=1, command_id="launch-77-1b"))  # same attempt
    refusal = wait_for(lambda: events(redis_client, "command_rejected"))[0]
    assert "is not newer than attempt 1" in refusal.reason
    assert runs.read_text() == "run\n" and len(started(redis_client, 77)) == 1


def test_a_resent_launch_after_its_reports_were_lost_is_answered_with_its_real_exit(
        redis_url, redis_client, start_agent, tmp_path):
    """A job whose start and exit were both lost (sent, then Redis restarted empty, while its agent
    was killed and restarted) stayed PLACED for ever: the control plane re-sends its launch, and
    the new agent, rightly, does not run it again. It now says how that attempt ended."""
    runs = tmp_path / "runs.txt"
    first_agent = start_agent(redis_url)
    cmd = launch(python(f"open({str(runs)!r}, 'a').write('run\\n'); print('done once')"), attempt=1,
                 command_id="launch-78-1", job_id=78)
    send(redis_client, "n1", cmd)
    [first] = wait_for(lambda: exited(redis_client, 78))
    first_agent.stop()
    redis_client.delete(protocol.node_events_stream("n1"))  # what the control plane never read

    start_agent(redis_url)  # a new agent process: nothing in memory, the same work directory
    wait_for(lambda: events(redis_client, "node_registered"))
    send(redis_client, "n1", cmd)  # the scheduling loop's re-send of a launch not seen to start
    [again] = wait_for(lambda: exited(redis_client, 78))
    assert again == first and (again.exit_code, again.output_tail) == (0, "done once\n")
    assert runs.read_text() == "run\n" and started(redis_client, 78) == []  # told, not run again


def test_a_resent_launch_of_a_running_job_says_it_started(redis_url, redis_client, start_agent, monkeypatch):
    from agents import command_intake

    monkeypatch.setattr(command_intake, "REANSWER_AFTER_S", 0.5)  # (the control plane re-sends after 15 s)
    start_agent(redis_url)
    cmd = launch(python(SLEEPER), job_id=79, command_id="launch-79-1")
    send(redis_client, "n1", cmd)
    [first] = wait_for(lambda: started(redis_client, 79))
    send(redis_client, "n1", cmd)  # delivered twice at once: a duplicate, nothing to say
    time.sleep(0.6)
    assert len(started(redis_client, 79)) == 1
    send(redis_client, "n1", cmd)  # its start report was lost: the control plane re-sends the launch
    second = wait_for(lambda: started(redis_client, 79)[1:])[0]
    assert second.pid == first.pid and second.launch_id == "launch-79-1"  # the same process, not a new one


def test_a_query_about_an_attempt_answers_and_touches_nothing(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    running = launch(python("import time; time.sleep(30)"), job_id=501, command_id="launch-501-1")
    ended = launch(python("print('over')"), job_id=502, command_id="launch-502-1")
    send(redis_client, "n1", running)
    send(redis_client, "n1", ended)
    wait_for(lambda: started(redis_client, 501) and exited(redis_client, 502))
    for job_id, launch_id in ((501, "launch-501-1"), (502, "launch-502-1"), (503, "launch-503-4")):
        send(redis_client, "n1", protocol.QueryAttempt(command_id=f"q-{job_id}", job_id=job_id, launch_id=launch_id))
    # Running: its start again (the control plane may have lost it); it keeps running.
    wait_for(lambda: len(started(redis_client, 501)) == 2)
    # Ended here: its exit again, with its real outcome.
    again = wait_for(lambda: exited(redis_client, 502)[1:])[0]
    assert (again.exit_code, again.output_tail, again.absent) == (0, "over\n", False)
    # Never here: absent, naming the attempt.
    [unknown] = wait_for(lambda: exited(redis_client, 503))
    assert (unknown.absent, unknown.launch_id) == (True, "launch-503-4")
    time.sleep(0.3)
    assert exited(redis_client, 501) == []


def test_a_launch_waits_until_an_earlier_attempt_still_running_here_is_stopped(redis_url, redis_client, start_agent,
                                                                                tmp_path):
    """Attempt 1's stop was lost (a partition): attempt 2 arrives. The agent stops attempt 1 and
    runs attempt 2 when the control plane re-sends it; the two never run at once."""
    start_agent(redis_url)
    marks = tmp_path / "marks"
    code = f"import os, time; open({str(marks)!r}, 'a').write(os.environ['COLONY_JOB_ID'] + ' {{}}\\n'); time.sleep(30)"
    send(redis_client, "n1", launch(python(code.format(1)), job_id=600, command_id="launch-600-1", attempt=1))
    wait_for(lambda: marks.exists() and marks.read_text() == "600 1\n")
    second = launch(python(code.format(2)), job_id=600, command_id="launch-600-2", attempt=2, stop_grace_s=1)
    send(redis_client, "n1", second)
    first_end = wait_for(lambda: exited(redis_client, 600))[0]
    assert first_end.launch_id == "launch-600-1" and first_end.stopped
    assert len(started(redis_client, 600)) == 1  # deferred, not run beside attempt 1
    send(redis_client, "n1", second)  # the control plane's re-send
    wait_for(lambda: len(started(redis_client, 600)) == 2)
    assert started(redis_client, 600)[-1].launch_id == "launch-600-2"
    wait_for(lambda: marks.read_text() == "600 1\n600 2\n")  # one after the other


def test_the_exits_kept_on_disk_are_bounded_and_read_back_by_the_next_agent(tmp_path, monkeypatch):
    from agents import agent as agent_module, recent_exits
    from agents.backends.simulated import SimulatedBackend
    from agents.accounts import RunAsPolicy
    from agents.runner import JobRunner

    monkeypatch.setattr(recent_exits, "RECENT_EXITS", 4)

    def new_agent():
        return agent_module.Agent("n1", SimulatedBackend("1xT4-16GB", "n1"), "redis://127.0.0.1:1/0",
                                  JobRunner(tmp_path / "work", run_as=RunAsPolicy(allow_root=True)))

    first = new_agent()
    for job_id in range(1, 31):
        first._publish(protocol.JobExited(node="n1", job_id=job_id, exit_code=0, launch_id=f"launch-{job_id}-0",
                                          finished_at=time.time()))
    kept = (tmp_path / "work" / recent_exits.RECENT_EXITS_FILE).read_text().splitlines()
    assert len(kept) <= 2 * 4 + 1  # rewritten as it grows, never the whole history
    later = new_agent()
    later._load_recent_exits()
    assert [m.job_id for _, m in later._recent_exits] == [27, 28, 29, 30]
    assert later._recent_exit(30, "launch-30-0").exit_code == 0 and later._recent_exit(3, "launch-3-0") is None


@pytest.mark.parametrize("spawned", [False, True], ids=["before-the-spawn-record", "after-it"])
def test_a_launch_an_earlier_agent_took_but_died_before_starting_runs_when_resent(
        redis_url, redis_client, start_agent, tmp_path, spawned):
    """An agent killed between writing a launch's record and spawning its supervisor left a job that
    never ran; the next agent remembered the launch as applied and skipped every re-send, so the
    job stayed PLACED for ever (found by the chaos test). It now runs it, once. Killed a step
    later (``spawned``: its spawn record written, the job never handed to a supervisor), the same,
    once past the time a supervisor has to answer with none holding the job directory's lock."""
    import os

    from agents import supervise
    from agents.runner import SUPERVISOR_START_SECONDS

    runs = tmp_path / "runs.txt"
    first_agent = start_agent(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"))
    cmd = launch(python(f"open({str(runs)!r}, 'a').write('run\\n')"), attempt=1, command_id="launch-81-1", job_id=81)
    job_dir = first_agent.agent.runner.job_dir(81)
    job_dir.mkdir(parents=True)
    supervise.write_json_atomically(job_dir / "launch.json", json.loads(cmd.model_dump_json()), mode=0o600)
    if spawned:
        supervise.make_lock(job_dir)
        supervise.write_json_atomically(job_dir / "spawned.json", {"launch_id": cmd.command_id}, mode=0o600)
        old = time.time() - SUPERVISOR_START_SECONDS - 1
        os.utime(job_dir / "spawned.json", (old, old))
    first_agent.stop()  # (as if killed right there: no supervisor spawned, or none handed the job)

    start_agent(redis_url)
    wait_for(lambda: len(events(redis_client, "node_registered")) == 2)
    send(redis_client, "n1", cmd)  # the scheduling loop's re-send of a launch not seen to start
    [done] = wait_for(lambda: exited(redis_client, 81))
    assert done.exit_code == 0 and done.launch_id == "launch-81-1"
    send(redis_client, "n1", cmd)  # re-sent again (its reports not yet read): answered, not run
    marker = launch(python("pass"))
    send(redis_client, "n1", marker)
    wait_for(lambda: exited(redis_client, marker.job_id))
    assert runs.read_text() == "run\n" and len(started(redis_client, 81)) == 1


def test_a_job_whose_supervisor_wrote_its_record_after_the_new_agent_looked_is_adopted_when_resent(
        redis_url, redis_client, start_agent, tmp_path):
    """An agent killed just after spawning a job's supervisor, and restarted at once, looked for
    that job's record before the supervisor (a fresh interpreter) had written it: the job ran with
    nobody to report it, and every re-send of its launch was skipped as applied, so it stayed
    PLACED for ever. The re-send now finds the record and the job is adopted: the same process."""
    from agents.accounts import RunAsPolicy
    from agents.runner import JobRunner

    runs = tmp_path / "runs.txt"
    earlier = JobRunner(tmp_path / "agent-n1", run_as=RunAsPolicy(allow_root=True))  # (start_agent's workdir)
    cmd = launch(python(f"import time; open({str(runs)!r}, 'a').write('run\\n'); time.sleep(1.5); print('done')"),
                 attempt=1, command_id="launch-82-1", job_id=82)
    pid = earlier.launch(cmd)
    earlier._cycler.close()  # (what the agent's SIGKILL leaves: its supervisor runs on)
    record = earlier.job_dir(82) / "process.json"
    written = record.read_bytes()
    record.unlink()  # not written yet when the next agent looks

    start_agent(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"))
    record.write_bytes(written)  # (the supervisor gets there)
    send(redis_client, "n1", cmd)  # the scheduling loop's re-send of a launch not seen to start
    [start] = wait_for(lambda: started(redis_client, 82))
    assert start.pid == pid and start.launch_id == "launch-82-1"
    [done] = wait_for(lambda: exited(redis_client, 82))
    assert (done.exit_code, done.output_tail, done.requeue) == (0, "done\n", False)
    assert runs.read_text() == "run\n"  # adopted, never run a second time


def test_a_stop_for_a_job_whose_supervisor_wrote_its_record_late_stops_it_rather_than_say_absent(
        redis_url, redis_client, start_agent, tmp_path):
    """The same job cancelled before its launch is re-sent: told "absent", the control plane would
    free its GPUs while it ran on, unseen (review). The stop adopts it and stops it."""
    import psutil

    from agents.accounts import RunAsPolicy
    from agents.runner import JobRunner

    earlier = JobRunner(tmp_path / "agent-n1", run_as=RunAsPolicy(allow_root=True))
    cmd = launch(python(SLEEPER), attempt=1, command_id="launch-83-1", job_id=83)
    pid = earlier.launch(cmd)
    earlier._cycler.close()
    record = earlier.job_dir(83) / "process.json"
    written = record.read_bytes()
    record.unlink()

    start_agent(redis_url)
    wait_for(lambda: events(redis_client, "node_registered"))
    record.write_bytes(written)
    send(redis_client, "n1", protocol.StopJob(command_id="stop-83", job_id=83, grace_seconds=1,
                                              launch_id="launch-83-1"))
    [done] = wait_for(lambda: exited(redis_client, 83))
    assert (done.stopped, done.absent, done.launch_id) == (True, False, "launch-83-1")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
