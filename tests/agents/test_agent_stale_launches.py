"""A launch starts only for the attempt the control plane holds now.

A paused agent (SIGSTOP for a minute) resumed with a backlog: launches the control plane had
requeued meanwhile, with their stops further on in the same stream. It started them (they were
well under the 300 s command age), and 10 of 15 such jobs completed a second time. The agent now
reads its whole backlog before it acts, drops a launch a later entry withdraws (a stop of that
attempt, a newer attempt's launch), and starts no launch that waited in the stream past its lease:
the control plane's re-send, issued afresh while it still holds the attempt, is what runs.

Each test fills the node's stream before its agent reads it, as a paused agent finds it on
resuming, with commands signed as the control plane signs them.
"""

from __future__ import annotations

import time

from agents import protocol, signing
from tests.agents.helpers import events, launch, python, stop, wait_for

KEY = signing.node_key("s" * 32, "n1")


def xadd(client, command, *, age_s: float = 0.0) -> None:
    """``command`` as the control plane sends it (naming n1, issued and MACed), added to the
    stream ``age_s`` ago (its entry id says when Redis took it)."""
    issued = time.time() - age_s
    fields = signing.signed_command(
        protocol.encode(command.model_copy(update={"node": "n1", "issued_at": issued})), KEY)
    entry_id = "*" if not age_s else f"{int(issued * 1000)}-0"
    client.xadd(protocol.command_stream("n1"), fields, id=entry_id)


def started(client, job_id):
    return [e for e in events(client, "job_started") if e.job_id == job_id]


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def run_marker(client):
    """A fresh launch, waited for: commands apply in order, so everything before it was dealt with."""
    marker = launch(python("pass"), attempt=1)
    xadd(client, marker)
    wait_for(lambda: exited(client, marker.job_id), timeout=10)


def test_resumed_agent_does_not_start_a_launch_stopped_later_in_its_stream(redis_url, redis_client, start_agent,
                                                                           tmp_path):
    ran = tmp_path / "ran"
    doomed = launch(python(f"open({str(ran)!r}, 'w').write('ran')"), job_id=501, attempt=1,
                    command_id="launch-501-1")
    xadd(redis_client, doomed, age_s=60)  # placed just before the agent paused
    xadd(redis_client, stop(501, command_id="stop-501").model_copy(update={"launch_id": "launch-501-1"}),
         age_s=20)  # its node lost, the job requeued: the stop of that attempt
    agent = start_agent(redis_url, key=KEY)  # resumes and reads its backlog
    run_marker(redis_client)
    assert started(redis_client, 501) == [] and not ran.exists()
    [answer] = exited(redis_client, 501)  # the stop is answered: not running here
    assert answer.absent and answer.launch_id == "launch-501-1"
    assert agent.agent.stale_launches == 1


def test_a_fresh_launch_whose_stop_follows_in_the_same_batch_never_starts(redis_url, redis_client, start_agent):
    doomed = launch(python("import time; time.sleep(30)"), job_id=502, attempt=1, command_id="launch-502-1")
    xadd(redis_client, doomed)
    xadd(redis_client, stop(502).model_copy(update={"launch_id": "launch-502-1"}))  # cancelled at once
    start_agent(redis_url, key=KEY)
    run_marker(redis_client)
    assert started(redis_client, 502) == []
    assert [e.absent for e in exited(redis_client, 502)] == [True]


def test_of_two_attempts_of_a_job_in_one_batch_only_the_newer_starts(redis_url, redis_client, start_agent):
    first = launch(python("import time; time.sleep(30)"), job_id=503, attempt=1, command_id="launch-503-1")
    second = launch(python("print('second')"), job_id=503, attempt=2, command_id="launch-503-2")
    xadd(redis_client, first)
    xadd(redis_client, second)
    start_agent(redis_url, key=KEY)
    [done] = wait_for(lambda: exited(redis_client, 503), timeout=10)
    assert [s.launch_id for s in started(redis_client, 503)] == ["launch-503-2"]
    assert done.launch_id == "launch-503-2" and done.exit_code == 0


def test_a_launch_that_waited_past_its_lease_runs_only_once_the_control_plane_sends_it_afresh(
        redis_url, redis_client, start_agent, tmp_path):
    runs = tmp_path / "runs"
    held = launch(python(f"open({str(runs)!r}, 'a').write('run\\n')"), job_id=504, attempt=1,
                  command_id="launch-504-1")
    xadd(redis_client, held, age_s=30)  # the control plane may have requeued it since: not started
    start_agent(redis_url, key=KEY)
    run_marker(redis_client)
    assert started(redis_client, 504) == [] and not runs.exists()
    xadd(redis_client, held)  # the scheduling loop's re-send: the job is still placed at attempt 1
    [done] = wait_for(lambda: exited(redis_client, 504), timeout=10)
    assert done.exit_code == 0 and runs.read_text() == "run\n"
    assert len(started(redis_client, 504)) == 1
