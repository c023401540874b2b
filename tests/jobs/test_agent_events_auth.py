"""Agent authentication on the events stream: a node cannot move another node's jobs, nor register
in another node's name (COLONY_AGENT_AUTH=required)."""

import time

import pytest

from agents import protocol, signing
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from monitoring.models import Node
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "events-test-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def auth_required(settings, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


@pytest.fixture
def job_on_a(db):
    """A RUNNING job placed on ``node-a``; ``node-b`` exists too."""
    NodeFactory(name="node-b")
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name="node-a"), index=0))
    return job


def emit(redis_client, message, signer: str | None):
    key = signing.node_key(SECRET, signer) if signer else None
    redis_client.xadd(protocol.EVENTS_STREAM, signing.signed(protocol.encode(message), key))


def exited(job, node, code=0):
    return protocol.JobExited(node=node, job_id=job.pk, exit_code=code, output_tail="forged?", finished_at=time.time())


def reasons(redis_client) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def test_an_exit_forged_by_node_b_for_node_as_job_is_rejected(job_on_a, redis_client):
    emit(redis_client, exited(job_on_a, node="node-a", code=1), signer="node-b")
    assert consume_events(redis_client) == 1
    job_on_a.refresh_from_db()
    assert (job_on_a.state, job_on_a.exit_code, job_on_a.output_tail) == (JobState.RUNNING, None, "")
    assert Allocation.objects.filter(job=job_on_a, released_at__isnull=True).exists()
    assert reasons(redis_client) == ["bad signature for node node-a"]


def test_node_b_signing_in_its_own_name_cannot_end_node_as_job_either(job_on_a, redis_client):
    emit(redis_client, exited(job_on_a, node="node-b", code=1), signer="node-b")
    consume_events(redis_client)
    job_on_a.refresh_from_db()
    assert job_on_a.state == JobState.RUNNING
    assert reasons(redis_client) == [f"job {job_on_a.pk} was never placed on node node-b"]


def test_an_unsigned_exit_is_rejected(job_on_a, redis_client):
    emit(redis_client, exited(job_on_a, node="node-a"), signer=None)
    consume_events(redis_client)
    job_on_a.refresh_from_db()
    assert job_on_a.state == JobState.RUNNING
    assert reasons(redis_client) == ["unsigned message (agent authentication is required)"]


def test_the_exit_signed_by_the_jobs_own_node_is_applied(job_on_a, redis_client):
    emit(redis_client, exited(job_on_a, node="node-a", code=0), signer="node-a")
    consume_events(redis_client)
    job_on_a.refresh_from_db()
    assert (job_on_a.state, job_on_a.exit_code) == (JobState.SUCCEEDED, 0)
    assert reasons(redis_client) == []


def test_a_registration_in_another_nodes_name_creates_and_changes_nothing(db, redis_client):
    gpus = [protocol.GpuInfo(index=0, uuid="GPU-evil", model="H100-80GB", memory_mib=81559)]
    emit(redis_client, protocol.NodeRegistered(node="node-a", gpus=gpus, backend="simulated", agent_version="x",
                                               hostname="evil"), signer="node-b")
    consume_events(redis_client)
    assert not Node.objects.filter(name="node-a").exists()
    emit(redis_client, protocol.NodeRegistered(node="node-a", gpus=gpus, backend="simulated", agent_version="x",
                                               hostname="good"), signer="node-a")
    consume_events(redis_client)
    assert Node.objects.get(name="node-a").hostname == "good"


def test_unsigned_events_are_applied_when_authentication_is_off(job_on_a, redis_client, settings):
    settings.COLONY_AGENT_AUTH = "off"
    emit(redis_client, exited(job_on_a, node="node-a", code=0), signer=None)
    consume_events(redis_client)
    job_on_a.refresh_from_db()
    assert job_on_a.state == JobState.SUCCEEDED
