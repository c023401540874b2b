"""Authenticated commands: the control plane MACs every command with the target node's key, in a
domain of its own, over the node it is for and when it was issued (and a launch's attempt); an
agent holding its key applies nothing else. Each attack below is what a client of Redis that can
append to a node's command stream would try; it must run nothing and leave a dead letter saying why."""

from __future__ import annotations

import json
import time

import pytest

from agents import protocol, signing
from tests.agents.helpers import events, launch, python, stop, wait_for

SECRET = "s" * 32
KEY = signing.node_key(SECRET, "n1")
OTHER_KEY = signing.node_key(SECRET, "n2")


def command_fields(command, *, node: str = "n1", key: bytes | None = KEY, issued_at: float | None = None) -> dict:
    """Stream fields as the control plane writes them: stamped with ``node`` and the issue time,
    MACed with ``key`` (None: unsigned)."""
    stamped = command.model_copy(update={"node": node, "issued_at": time.time() if issued_at is None else issued_at})
    return signing.signed_command(protocol.encode(stamped), key)


def xadd(client, fields: dict, node: str = "n1") -> None:
    client.xadd(protocol.command_stream(node), fields)


def writes_marker(tmp_path, name: str) -> list[str]:
    """argv of a job that leaves ``tmp_path/name`` behind if it ever runs."""
    return python(f"open({str(tmp_path / name)!r}, 'w').write('ran')")


def dead_letters(client) -> list[str]:
    """Why the agent refused each command it refused (it reports them on its events stream; the
    control plane dead-letters them)."""
    return [event.reason for event in events(client, "command_rejected")]


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def started(client, job_id):
    return [e for e in events(client, "job_started") if e.job_id == job_id]


def run_marker(client, node: str = "n1", key: bytes = KEY):
    """Send a properly signed launch and wait for it to end: commands are applied in order, so
    everything sent before it has been dealt with."""
    marker = launch(python("pass"), attempt=0)
    xadd(client, command_fields(marker, node=node, key=key), node)
    [done] = wait_for(lambda: exited(client, marker.job_id), timeout=10)
    assert done.exit_code == 0


# ---------------------------------------------------------------- MACs


def test_a_command_mac_verifies_only_with_the_nodes_key_and_the_same_bytes():
    m = protocol.encode(launch(["true"]))["m"]
    sig = signing.sign_command(KEY, m)
    assert signing.verify_command(KEY, m.encode(), sig.encode())  # as Redis hands them back
    assert not signing.verify_command(OTHER_KEY, m, sig)
    assert not signing.verify_command(KEY, m.replace('"argv":["true"]', '"argv":["false"]'), sig)
    for forged in (None, "", "00" * 32, sig[:-1]):
        assert not signing.verify_command(KEY, m, forged)


def test_an_agents_signed_event_is_not_a_valid_command_and_a_command_is_not_a_valid_event():
    # Same node key on both sides: the command domain keeps the two apart.
    m = protocol.encode(launch(["true"]))["m"]
    assert not signing.verify_command(KEY, m, signing.sign(KEY, m))
    assert not signing.verify(KEY, m, signing.sign_command(KEY, m))


def test_commands_carry_their_mac_node_issue_time_and_attempt_on_the_wire():
    fields = command_fields(launch(["true"], job_id=5, attempt=2), issued_at=1_700_000_000.5)
    assert set(fields) == {"m", "sig"}
    decoded = protocol.decode_command(fields)
    assert (decoded.node, decoded.issued_at, decoded.attempt) == ("n1", 1_700_000_000.5, 2)
    with pytest.raises(protocol.ProtocolError, match="unexpected stream fields: extra"):
        protocol.decode_command({**fields, "extra": "1"})


@pytest.mark.parametrize("field, value", [
    ("issued_at", float("nan")), ("issued_at", float("inf")), ("issued_at", 1e20), ("issued_at", -1.0),
    ("node", "a/b"), ("node", "x" * 64), ("attempt", -1), ("attempt", 10**9),
])
def test_a_command_with_an_unbounded_issue_time_node_or_attempt_is_rejected(field, value):
    payload = json.loads(protocol.encode(launch(["true"], attempt=0))["m"])
    payload[field] = value
    with pytest.raises(protocol.ProtocolError, match=field):
        protocol.decode_command({"m": json.dumps(payload)})


# ---------------------------------------------------------------- a keyed agent refuses forgeries


@pytest.fixture
def agent(redis_url, redis_client, start_agent):
    running = start_agent(redis_url, key=KEY)
    wait_for(lambda: events(redis_client, "node_registered"))
    return running


def test_a_properly_signed_launch_runs(agent, redis_client, tmp_path):
    job = launch(writes_marker(tmp_path, "ran"), attempt=0)
    xadd(redis_client, command_fields(job))
    [done] = wait_for(lambda: exited(redis_client, job.job_id), timeout=10)
    assert done.exit_code == 0 and done.launch_id == job.command_id
    assert (tmp_path / "ran").read_text() == "ran"
    assert dead_letters(redis_client) == []


def test_forged_launches_run_nothing_and_are_dead_lettered_with_the_reason(agent, redis_client, tmp_path):
    now = time.time()
    attacks = {
        "unsigned": (command_fields(launch(writes_marker(tmp_path, "unsigned"), attempt=0), key=None), "n1"),
        "other key": (command_fields(launch(writes_marker(tmp_path, "other-key"), attempt=0), key=OTHER_KEY), "n1"),
        # A genuine command for n2 (n2's key, naming n2), copied into n1's stream.
        "for n2": (command_fields(launch(writes_marker(tmp_path, "for-n2"), attempt=0), node="n2", key=OTHER_KEY),
                   "n1"),
        "stale": (command_fields(launch(writes_marker(tmp_path, "stale"), attempt=0), issued_at=now - 400), "n1"),
        "future": (command_fields(launch(writes_marker(tmp_path, "future"), attempt=0), issued_at=now + 120), "n1"),
        # MACed with n1's own key but naming n2 (say, a control plane that mixed up its nodes).
        "names n2": (command_fields(launch(writes_marker(tmp_path, "names-n2"), attempt=0), node="n2"), "n1"),
        # The node's own key, but the event domain (as if an agent's signed message were replayed).
        "event mac": (None, "n1"),
    }
    event_mac = launch(writes_marker(tmp_path, "event-mac"), attempt=0)
    m = protocol.encode(event_mac.model_copy(update={"node": "n1", "issued_at": now}))["m"]
    attacks["event mac"] = ({"m": m, "sig": signing.sign(KEY, m)}, "n1")
    for fields, node in attacks.values():
        xadd(redis_client, fields, node)
    run_marker(redis_client)

    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("agent")) == []
    reasons = dead_letters(redis_client)
    assert len(reasons) == len(attacks), reasons
    unsigned, other_key, for_n2, stale, future, names_n2, event_mac_reason = reasons
    assert "unsigned" in unsigned
    assert all("bad signature" in reason for reason in (other_key, for_n2, event_mac_reason))
    assert "for node n2, not n1" in names_n2
    assert "stale: issued 400s ago" in stale
    assert "in the future" in future
    assert all(not started(redis_client, job_id) and not exited(redis_client, job_id)
               for job_id in _job_ids(attacks))
    # A refused launch's env may hold a job's secrets: no excerpt of a command entry travels.
    assert all("raw" not in event.model_dump() for event in events(redis_client, "command_rejected"))


def _job_ids(attacks) -> list[int]:
    return [json.loads(fields["m"])["job_id"] for fields, _node in attacks.values()]


def test_a_replayed_launch_of_an_older_attempt_is_refused(agent, redis_client, tmp_path):
    first = launch(writes_marker(tmp_path, "attempt-0"), job_id=900, attempt=0, command_id="launch-900-0")
    captured = command_fields(first)
    xadd(redis_client, captured)
    wait_for(lambda: exited(redis_client, 900), timeout=10)
    (tmp_path / "attempt-0").unlink()
    second = launch(python("pass"), job_id=900, attempt=1, command_id="launch-900-1")
    xadd(redis_client, command_fields(second))
    wait_for(lambda: len(exited(redis_client, 900)) == 2, timeout=10)

    # The captured entry replayed inside the freshness window: attempt 0 is older than attempt 1.
    xadd(redis_client, captured)
    # A re-send of the current attempt (resend_unstarted_launches) is a harmless duplicate.
    xadd(redis_client, command_fields(second))
    # The current attempt under a command id of its own is no newer than what ran.
    xadd(redis_client, command_fields(second.model_copy(update={"command_id": "launch-900-1-again"})))
    run_marker(redis_client)

    assert not (tmp_path / "attempt-0").exists()
    assert [e.launch_id for e in started(redis_client, 900)] == ["launch-900-0", "launch-900-1"]
    older, same = dead_letters(redis_client)
    assert "launch attempt 0 of job 900 is older than attempt 1" in older
    assert "launch attempt 1 of job 900 is not newer than attempt 1" in same


def test_a_launch_refused_as_stale_runs_when_the_control_plane_sends_it_again_fresh(agent, redis_client):
    job = launch(python("pass"), attempt=3, command_id="launch-77-3", job_id=77)
    xadd(redis_client, command_fields(job, issued_at=time.time() - 600))  # e.g. read after a long outage
    xadd(redis_client, command_fields(job))  # resend_unstarted_launches: same command id, fresh
    [done] = wait_for(lambda: exited(redis_client, 77), timeout=10)
    assert done.exit_code == 0 and done.launch_id == "launch-77-3"
    [reason] = dead_letters(redis_client)
    assert "stale" in reason


def test_an_unsigned_stop_does_not_end_a_job_and_a_signed_one_does(agent, redis_client):
    job = launch(python("import time; time.sleep(60)"), attempt=0)
    xadd(redis_client, command_fields(job))
    wait_for(lambda: started(redis_client, job.job_id), timeout=10)
    xadd(redis_client, command_fields(stop(job.job_id, grace=1), key=None))
    xadd(redis_client, command_fields(stop(job.job_id, grace=1), key=OTHER_KEY))
    run_marker(redis_client)
    assert exited(redis_client, job.job_id) == []
    assert len(dead_letters(redis_client)) == 2
    xadd(redis_client, command_fields(stop(job.job_id, grace=1)))
    [done] = wait_for(lambda: exited(redis_client, job.job_id), timeout=10)
    assert done.stopped


def test_the_freshness_window_is_configurable(redis_url, redis_client, start_agent):
    start_agent(redis_url, key=KEY, command_max_age=5)
    job = launch(python("pass"), attempt=0)
    xadd(redis_client, command_fields(job, issued_at=time.time() - 30))
    run_marker(redis_client)
    assert exited(redis_client, job.job_id) == []
    assert "stale: issued 30s ago (at most 5s)" in dead_letters(redis_client)[0]


# ---------------------------------------------------------------- without a key (authentication off)


def test_an_agent_without_a_key_takes_unsigned_commands_but_not_another_nodes(redis_url, redis_client, start_agent,
                                                                               tmp_path):
    start_agent(redis_url)
    bare = launch(python("pass"))  # no node, no issue time: as tests and old control planes send
    xadd(redis_client, protocol.encode(bare))
    xadd(redis_client, command_fields(launch(writes_marker(tmp_path, "n2"), attempt=0), node="n2", key=None))
    wait_for(lambda: exited(redis_client, bare.job_id), timeout=10)
    run_marker(redis_client, key=None)
    assert not (tmp_path / "n2").exists()
    [reason] = dead_letters(redis_client)
    assert "for node n2, not n1" in reason
