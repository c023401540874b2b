"""Live job output on the control plane: what nodes ship is fanned in, authenticated, checked
against placements and kept bounded per job and node; the API serves it only to who sees the job."""

from __future__ import annotations

import pytest

from agents import protocol, signing
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services import job_logs
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "logs-test-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def auth_required(settings, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


@pytest.fixture
def job_on_a(db, vision, alice):
    NodeFactory(name="node-b")
    job = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice)
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name="node-a"), index=0))
    return job


def ship(redis_client, job, text, node="node-a", signer="same", offset=0, launch="launch-1-0", gap=False):
    """What ``node``'s agent writes on its own logs stream (signed by ``signer``'s key)."""
    message = protocol.JobOutput(node=node, job_id=job.pk, launch_id=launch, offset=offset,
                                 length=len(text.encode()), gap=gap, data=text)
    signer = node if signer == "same" else signer
    key = signing.node_key(SECRET, signer) if signer else None
    redis_client.xadd(protocol.node_logs_stream(node), signing.signed(protocol.encode(message), key))


def kept(redis_client, job, node="node-a") -> str:
    return "".join(c.data for c in job_logs.read_chunks(redis_client, job.pk, [node], limit=10_000))


def dead_letters(redis_client) -> list[str]:
    return [fields[b"reason"].decode() for _id, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def test_output_from_the_node_holding_the_job_is_kept_in_order(redis_client, job_on_a):
    ship(redis_client, job_on_a, "epoch 1\n")
    ship(redis_client, job_on_a, "epoch 2\n", offset=8)
    assert job_logs.consume_logs(redis_client) == 2
    assert kept(redis_client, job_on_a) == "epoch 1\nepoch 2\n"
    assert job_logs.log_nodes(redis_client, job_on_a.pk) == ["node-a"]
    ship(redis_client, job_on_a, "epoch 2\n", offset=8)  # sent twice (an agent restarted): kept once
    job_logs.consume_logs(redis_client)
    assert kept(redis_client, job_on_a) == "epoch 1\nepoch 2\n"
    assert redis_client.ttl(job_logs.job_log_stream(job_on_a.pk, "node-a")) > 0


def test_output_from_a_node_not_holding_the_job_is_refused(redis_client, job_on_a):
    ship(redis_client, job_on_a, "forged\n", node="node-b")
    job_logs.consume_logs(redis_client)
    assert job_logs.log_nodes(redis_client, job_on_a.pk) == []
    assert any("node node-b does not hold job" in reason for reason in dead_letters(redis_client))


@pytest.mark.parametrize("signer, reason", [(None, "unsigned message"), ("node-b", "bad signature for node node-a")])
def test_unsigned_or_forged_output_is_refused(redis_client, job_on_a, signer, reason):
    ship(redis_client, job_on_a, "forged\n", signer=signer)
    job_logs.consume_logs(redis_client)
    assert kept(redis_client, job_on_a) == ""
    assert any(reason in r for r in dead_letters(redis_client))


def test_a_job_printing_10_mb_keeps_redis_bounded(redis_client, job_on_a):
    chunk = "y" * (protocol.OUTPUT_CHUNK_BYTES - 1) + "\n"
    for i in range(10 * 1024 * 1024 // len(chunk)):  # 10 MiB, every byte shipped
        ship(redis_client, job_on_a, chunk, offset=i * len(chunk))
        if i % 200 == 199:
            job_logs.consume_logs(redis_client)
    job_logs.consume_logs(redis_client)
    stream = job_logs.job_log_stream(job_on_a.pk, "node-a")
    text = kept(redis_client, job_on_a)
    assert job_logs.LOG_BYTES_CAP - len(chunk) < len(text) <= job_logs.LOG_BYTES_CAP
    usage = (redis_client.memory_usage(stream, samples=0)
             + redis_client.memory_usage(job_logs.job_log_index(job_on_a.pk)))
    assert usage < 2 * job_logs.LOG_BYTES_CAP, usage
    # Many small chunks are capped by count as well.
    for i in range(job_logs.LOG_MAX_ENTRIES + 50):
        ship(redis_client, job_on_a, "z\n", offset=20_000_000 + 2 * i)
        if i % 200 == 199:
            job_logs.consume_logs(redis_client)
    while redis_client.xlen(protocol.node_logs_stream("node-a")) > 1:  # fan-in moves 128 a call
        job_logs.consume_logs(redis_client)
    assert redis_client.xlen(stream) <= job_logs.LOG_MAX_ENTRIES


def test_the_api_serves_output_to_who_sees_the_job_only(redis_client, job_on_a, api, alice, bob, charlie):
    ship(redis_client, job_on_a, "one\n")
    job_logs.consume_logs(redis_client)
    url = f"/api/v1/jobs/{job_on_a.pk}/logs/"
    for user in (alice, bob):  # owner, teammate
        body = api(user).get(url).json()
        assert body["nodes"] == ["node-a"] and [c["data"] for c in body["chunks"]] == ["one\n"]
        assert body["finished"] is False
    assert api(charlie).get(url).status_code == 404  # outsider
    assert api().get(url).status_code in (401, 403)
    after = api(alice).get(url).json()["next"]
    ship(redis_client, job_on_a, "two\n", offset=4)
    job_logs.consume_logs(redis_client)
    body = api(alice).get(url, {"node": "node-a", "after": after}).json()
    assert [c["data"] for c in body["chunks"]] == ["two\n"]
    assert api(alice).get(url, {"after": "nonsense"}).status_code == 400
    assert api(alice).get(url, {"node": "node-b"}).json()["chunks"] == []
