"""One bad event never holds up the events behind it: an event that fails to apply is tried a
bounded number of times, then dead-lettered with its reason, and the next one is applied in the
same call. An outage (database gone) still leaves the event pending for when it is back."""

import json
import time

import pytest
from django.db import IntegrityError, OperationalError

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services import agent_events
from jobs.services.agent_events import GROUP, consume_events
from monitoring.services import poison
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def placed_jobs(db):
    node = NodeFactory(name="n1")
    jobs = []
    for index in range(2):
        job = JobFactory(state=JobState.PLACED)
        Allocation.objects.create(job=job, gpu=GpuFactory(node=node, index=index))
        jobs.append(job)
    return jobs


def emit(redis_client, message) -> bytes:
    return redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))


def started(job):
    return protocol.JobStarted(node="n1", job_id=job.pk, pid=1234, started_at=time.time())


def dead_letters(redis_client) -> list[dict]:
    return [fields for _, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def pending(redis_client) -> int:
    return redis_client.xpending(protocol.EVENTS_STREAM, GROUP)["pending"]


def state_of(job) -> str:
    job.refresh_from_db()
    return job.state


@pytest.fixture
def failing_for(monkeypatch):
    """Make applying events of one job raise ``error`` (``times`` times; None: always)."""
    def arrange(job, error: Exception, times: int | None = None) -> list:
        real_apply, tries = agent_events.apply_event, []

        def apply_event(message):
            if getattr(message, "job_id", None) == job.pk and (times is None or len(tries) < times):
                tries.append(1)
                raise error
            return real_apply(message)

        monkeypatch.setattr(agent_events, "apply_event", apply_event)
        return tries

    return arrange


def test_an_event_that_fails_to_apply_is_dead_lettered_and_the_next_one_applied_in_the_same_call(
        placed_jobs, redis_client, live_redis, failing_for):
    poisoned, healthy = placed_jobs
    tries = failing_for(poisoned, OverflowError("date value out of range"))
    bad_id = emit(redis_client, started(poisoned))
    emit(redis_client, started(healthy))
    assert consume_events(redis_client) == 2
    assert state_of(healthy) == JobState.RUNNING
    assert state_of(poisoned) == JobState.PLACED
    assert len(tries) == poison.MAX_TRIES
    (letter,) = dead_letters(redis_client)
    assert letter[b"id"] == bad_id
    assert letter[b"reason"].decode() == (f"failed to apply {poison.MAX_TRIES} times: "
                                         "OverflowError: date value out of range")
    assert pending(redis_client) == 0
    consume_events(redis_client)  # and it is not tried again
    assert len(tries) == poison.MAX_TRIES


def test_an_event_that_failed_once_is_applied_on_its_next_try(placed_jobs, redis_client, live_redis, failing_for):
    job = placed_jobs[0]
    tries = failing_for(job, IntegrityError("duplicate key value"), times=1)
    emit(redis_client, started(job))
    consume_events(redis_client)
    assert len(tries) == 1
    assert state_of(job) == JobState.RUNNING
    assert dead_letters(redis_client) == []


def test_an_event_met_by_a_database_outage_waits_for_it_and_is_not_dead_lettered(
        placed_jobs, redis_client, live_redis, failing_for, monkeypatch):
    job = placed_jobs[0]
    tries = failing_for(job, OperationalError("connection refused"), times=poison.MAX_TRIES + 1)
    emit(redis_client, started(job))
    monkeypatch.setattr(agent_events, "CLAIM_IDLE_MS", 0)  # re-claim at once instead of after 30 s
    for _ in range(poison.MAX_TRIES + 1):
        with pytest.raises(OperationalError):
            consume_events(redis_client)
        assert pending(redis_client) == 1
    consume_events(redis_client)  # the database is back
    assert len(tries) == poison.MAX_TRIES + 1
    assert state_of(job) == JobState.RUNNING
    assert dead_letters(redis_client) == []


def test_the_reported_start_at_1e20_is_dead_lettered_and_the_exit_behind_it_applied(
        placed_jobs, redis_client, live_redis):
    first, second = placed_jobs
    emit(redis_client, started(second))
    # As the issue found it, hand-written and signed: a start time that is no datetime.
    poison_start = json.loads(protocol.encode(started(first))["m"]) | {"started_at": 1e20}
    redis_client.xadd(protocol.EVENTS_STREAM, {"m": json.dumps(poison_start), "sig": "00"})
    emit(redis_client, protocol.JobExited(node="n1", job_id=second.pk, exit_code=0, finished_at=time.time()))
    assert consume_events(redis_client) == 3
    assert state_of(second) == JobState.SUCCEEDED
    assert state_of(first) == JobState.PLACED
    (letter,) = dead_letters(redis_client)
    assert letter[b"reason"].decode().startswith("job_started.started_at: Input should be less than or equal to")
    assert pending(redis_client) == 0


def test_events_at_every_bound_the_schema_allows_are_applied(placed_jobs, redis_client, live_redis):
    # The bounds must fit what stores them: no event the schema accepts fails in the database.
    job = placed_jobs[0]
    gpus = [protocol.GpuInfo(index=i, uuid=f"GPU-edge-{i}", model="X", memory_mib=protocol.MEMORY_MIB_MAX)
            for i in (0, 63)]
    emit(redis_client, protocol.NodeRegistered(
        node="edge", gpus=gpus, backend="nvml", agent_version="0.1", hostname="h",
        topology=[protocol.GpuLink(a=0, b=63, kind="nvlink", bandwidth_gbps=protocol.BANDWIDTH_GBPS_MAX)],
    ))
    emit(redis_client, protocol.JobStarted(node="n1", job_id=job.pk, pid=protocol.PID_MAX,
                                           started_at=protocol.UNIX_TIME_MAX))
    emit(redis_client, protocol.JobExited(node="n1", job_id=job.pk, exit_code=protocol.EXIT_CODE_MIN,
                                          finished_at=protocol.UNIX_TIME_MAX))
    consume_events(redis_client)
    assert dead_letters(redis_client) == []
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.finished_at.year) == (JobState.FAILED, -255, 2100)
    from monitoring.models import Gpu

    assert Gpu.objects.get(uuid="GPU-edge-63").memory_mib == protocol.MEMORY_MIB_MAX
