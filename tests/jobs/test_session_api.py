"""The session API: only a session's owner types into it or reads it (a teammate is refused, an
outsider sees no such job); keystrokes go to the node holding the job, MACed with its key;
output is served only when the node holding the job signed it; oversized input is refused with
a clear message; and submitting a session is checked like every field."""

from __future__ import annotations

import base64
import time

import pytest

from agents import protocol, sessions, signing
from jobs.choices import JobState
from jobs.models import Allocation
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "session-test-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def auth_required(settings, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


@pytest.fixture
def session(db, vision, alice):
    job = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice, env={protocol.SESSION_IDLE_ENV: "600"})
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name="node-a"), index=0))
    return job


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def typed(redis_client, node="node-a") -> list[tuple[protocol.SessionInput, dict]]:
    entries = redis_client.xrange(protocol.session_input_stream(node))
    return [(protocol.decode_session_input(fields), fields) for _id, fields in entries]


def prints(redis_client, job, text: bytes, node="node-a", signer="node-a", eof=False):
    message = protocol.SessionOutput(node=node, job_id=job.pk, launch_id=f"launch-{job.pk}-0", data=b64(text),
                                     eof=eof)
    key = signing.node_key(SECRET, signer) if signer else None
    redis_client.xadd(protocol.session_output_stream("node-a", job.pk), signing.signed(protocol.encode(message), key))


def test_the_owner_types_into_the_session_through_the_node_holding_it(api, alice, session, redis_client):
    answer = api(alice).post(f"/api/v1/jobs/{session.pk}/session/input/",
                             {"data": b64(b"ls\r"), "rows": 40, "cols": 120}, format="json")
    assert answer.status_code == 202, answer.content
    [(message, fields)] = typed(redis_client)
    assert (message.job_id, message.launch_id, message.node) == (session.pk, f"launch-{session.pk}-0", "node-a")
    assert base64.b64decode(message.data) == b"ls\r" and (message.rows, message.cols) == (40, 120)
    key = signing.node_key(SECRET, "node-a")
    assert sessions.verify_input(key, fields[b"m"], fields[b"sig"])
    assert not signing.verify_command(key, fields[b"m"], fields[b"sig"])  # never a command


def test_a_teammate_may_watch_but_not_type_and_an_outsider_sees_no_such_job(api, bob, charlie, session,
                                                                            redis_client):
    prints(redis_client, session, b"$ ")
    url = f"/api/v1/jobs/{session.pk}/session/"
    refused = api(bob).post(url + "input/", {"data": b64(b"id\r")}, format="json")
    assert refused.status_code == 403 and "Only alice" in refused.json()["error"]["message"]
    assert base64.b64decode(api(bob).get(url + "output/?wait=0").json()["data"]) == b"$ "  # as colony logs shows it
    assert api(charlie).post(url + "input/", {"data": b64(b"id\r")}, format="json").status_code == 404
    assert api(charlie).get(url + "output/?wait=0").status_code == 404
    assert typed(redis_client) == []


def test_oversized_or_malformed_input_is_refused_with_a_reason(api, alice, session, redis_client):
    url = f"/api/v1/jobs/{session.pk}/session/input/"
    too_big = api(alice).post(url, {"data": b64(b"x" * (protocol.SESSION_INPUT_BYTES + 1))}, format="json")
    assert too_big.status_code == 413
    assert "at most 4096" in too_big.json()["error"]["message"]
    assert api(alice).post(url, {"data": "not base64!"}, format="json").status_code == 400
    assert api(alice).post(url, {"rows": 40}, format="json").status_code == 400
    assert typed(redis_client) == []


def test_input_to_a_session_that_is_not_running_is_a_conflict(api, alice, session):
    session.state = JobState.SUCCEEDED
    session.save()
    answer = api(alice).post(f"/api/v1/jobs/{session.pk}/session/input/", {"data": b64(b"x")}, format="json")
    assert answer.status_code == 409 and "not running" in answer.json()["error"]["message"]


def test_a_batch_job_has_no_session(api, alice, vision):
    job = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice)
    answer = api(alice).post(f"/api/v1/jobs/{job.pk}/session/input/", {"data": b64(b"x")}, format="json")
    assert answer.status_code == 404 and "batch job" in answer.json()["error"]["message"]
    started = time.monotonic()
    output = api(alice).get(f"/api/v1/jobs/{job.pk}/session/output/").json()
    assert (output["interactive"], output["data"]) == (False, "") and time.monotonic() - started < 5


def test_output_signed_by_the_node_holding_the_session_is_served_in_order(api, alice, session, redis_client):
    prints(redis_client, session, b"$ echo hi\r\nhi\r\n")
    prints(redis_client, session, b"forged\r\n", signer="node-b")  # another node's key
    prints(redis_client, session, b"unsigned\r\n", signer=None)
    prints(redis_client, session, b"$ ")
    answer = api(alice).get(f"/api/v1/jobs/{session.pk}/session/output/?wait=0").json()
    assert base64.b64decode(answer["data"]) == b"$ echo hi\r\nhi\r\n$ "
    assert answer["state"] == "RUNNING" and not answer["ended"]
    later = api(alice).get(f"/api/v1/jobs/{session.pk}/session/output/?wait=0.1&after={answer['next']}").json()
    assert later["data"] == "" and later["next"] == answer["next"]
    prints(redis_client, session, b"exit\r\n", eof=True)
    session.state, session.exit_code = JobState.FAILED, 3
    session.save()
    last = api(alice).get(f"/api/v1/jobs/{session.pk}/session/output/?after={answer['next']}").json()
    assert base64.b64decode(last["data"]) == b"exit\r\n"
    assert (last["ended"], last["state"], last["exit_code"]) == (True, "FAILED", 3)


def test_submitting_a_session_sets_its_idle_timeout_and_checks_its_fields(api, alice):
    client = api(alice)
    answer = client.post("/api/v1/jobs/", {"command": ["bash", "-l"], "gpus": 1, "interactive": True,
                                           "idle_timeout_s": 900}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["session"] == {"idle_timeout_s": 900} and answer.json()["max_nodes"] == 1
    batch = client.post("/api/v1/jobs/", {"command": ["true"], "gpus": 1}, format="json").json()
    assert batch["session"] is None
    for body, field in (({"idle_timeout_s": 900}, "idle_timeout_s"),
                        ({"interactive": True, "idle_timeout_s": 5}, "idle_timeout_s"),
                        ({"interactive": True, "array": "0-3"}, "array"),
                        ({"interactive": True, "max_nodes": 2}, "max_nodes"),
                        ({"env": {protocol.SESSION_IDLE_ENV: "60"}}, "env")):
        refused = client.post("/api/v1/jobs/", {"command": ["bash"], "gpus": 1, **body}, format="json")
        assert refused.status_code == 400 and field in refused.json()["error"]["fields"], (body, refused.content)
