"""One bad sample never stops ingest: garbage is dead-lettered at parse, a sample the database
refuses is tried a bounded number of times and then dead-lettered, and the samples around it are
applied in the same batch. A database *outage* still keeps the batch for when it is back."""

import json
import threading

import pytest
from django.db import DataError, IntegrityError, OperationalError

from agents import protocol
from monitoring.choices import Resolution
from monitoring.models import GpuRollup
from monitoring.services import ingest, poison
from agents.streams import dead_letter_count
from monitoring.services.ingest import GROUP, Ingestor
from monitoring.services.poison import PoisonCounter
from tests.monitoring.conftest import place_job

T0 = 1_700_000_000.0
POISON_TEMP = 66.5  # the reading the fake database below refuses


def sample(seq, ts, temp=60.0):
    return protocol.NodeSample(node="n1", ts=ts, seq=seq, gpus=[
        protocol.GpuSample(index=0, util_sm=50.0, mem_used_mib=1000, temperature_c=temp, power_w=200.0)])


def publish(redis_client, *samples) -> list:
    return [redis_client.xadd(protocol.METRICS_STREAM, protocol.encode(s)) for s in samples]


@pytest.fixture
def ingestor(redis_client, live_redis, node_n1):
    return Ingestor(redis_client, consumer="test")


@pytest.fixture
def refusing_database(monkeypatch):
    """``flush`` refuses any batch holding a GPU reading of POISON_TEMP (as PostgreSQL refuses a
    value for its column); ``calls`` records (samples, refused) of each flush."""
    real_flush, calls = ingest.flush, []

    def flush(acc):
        refused = any(bucket.temp_max == POISON_TEMP for bucket in acc.gpus.values())
        calls.append((sum(bucket.samples for bucket in acc.gpus.values()), refused))
        if refused:
            raise DataError("value out of range for the column")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", flush)
    return calls


def samples_in_rollups() -> int:
    return sum(GpuRollup.objects.filter(resolution=Resolution.TEN_SECONDS).values_list("samples", flat=True))


def dead_letters(redis_client) -> list[dict]:
    return [fields for _, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def pending(redis_client) -> int:
    return redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"]


def test_a_sample_the_database_refuses_is_dead_lettered_and_the_rest_of_the_batch_applied(
        ingestor, redis_client, refusing_database):
    good = [sample(seq, T0 + seq) for seq in range(1, 8)]
    ids = publish(redis_client, *good[:3], sample(4, T0 + 3.5, temp=POISON_TEMP), *good[3:])
    result = ingestor.run_once()
    assert (result.entries, result.samples, result.dead) == (8, 7, 1)
    assert samples_in_rollups() == 7  # each good sample once
    (letter,) = dead_letters(redis_client)
    assert letter[b"id"] == ids[3]
    assert letter[b"reason"].decode() == (f"failed to apply {poison.MAX_TRIES} times: "
                                         "DataError: value out of range for the column")
    assert pending(redis_client) == 0
    # The poison sample was tried alone exactly MAX_TRIES times; the batch was halved to find it.
    assert refusing_database.count((1, True)) == poison.MAX_TRIES
    assert refusing_database[:3] == [(8, True), (4, True), (2, False)]


def test_the_sample_behind_a_poison_one_is_applied_in_the_same_call(ingestor, redis_client, refusing_database):
    publish(redis_client, sample(1, T0 + 1, temp=POISON_TEMP), sample(2, T0 + 2))
    assert ingestor.run_once().samples == 1
    assert samples_in_rollups() == 1
    assert dead_letter_count(redis_client) == 1


def test_a_sample_refused_once_is_applied_on_its_next_try(ingestor, redis_client, monkeypatch):
    real_flush, failures = ingest.flush, []

    def flush_refusing_once(acc):
        if not failures:
            failures.append(1)
            raise IntegrityError("duplicate key (a concurrent reader inserted the bucket first)")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", flush_refusing_once)
    publish(redis_client, sample(1, T0 + 1))
    assert ingestor.run_once().samples == 1
    assert samples_in_rollups() == 1
    assert dead_letters(redis_client) == []


def test_a_database_outage_keeps_the_batch_and_dead_letters_nothing(ingestor, redis_client, monkeypatch):
    real_flush, failures = ingest.flush, []

    def flush_during_outage(acc):
        if len(failures) < 5:  # more than MAX_TRIES: an outage is not the data's fault
            failures.append(1)
            raise OperationalError("connection refused")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", flush_during_outage)
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2))
    for _ in range(5):
        with pytest.raises(OperationalError):
            ingestor.run_once()
        assert pending(redis_client) == 2
    assert ingestor.run_once().samples == 2
    assert samples_in_rollups() == 2
    assert dead_letters(redis_client) == []


def test_an_outage_in_the_middle_of_isolating_a_poison_sample_applies_nothing_twice(
        ingestor, redis_client, refusing_database, monkeypatch):
    flush_refusing_poison, outages = ingest.flush, []

    def flush(acc):
        if any(bucket.temp_max == 61.0 for bucket in acc.gpus.values()) and not outages:
            outages.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        flush_refusing_poison(acc)

    monkeypatch.setattr(ingest, "flush", flush)
    # Halves: [s1, poison] (s1 applied, poison dead-lettered), then [s3, s4] hits the outage.
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2, temp=POISON_TEMP), sample(3, T0 + 3),
            sample(4, T0 + 4, temp=61.0))
    with pytest.raises(OperationalError):
        ingestor.run_once()
    assert samples_in_rollups() == 1 and dead_letter_count(redis_client) == 1
    assert pending(redis_client) == 2
    assert ingestor.run_once().samples == 2
    assert samples_in_rollups() == 3  # s1, s3, s4 once each
    assert dead_letter_count(redis_client) == 1
    assert pending(redis_client) == 0


def test_garbage_is_dead_lettered_once_even_when_its_batch_waits_out_an_outage(ingestor, redis_client, monkeypatch):
    real_flush, failures = ingest.flush, []

    def flush_after_an_outage(acc):
        if not failures:
            failures.append(1)
            raise OperationalError("connection refused")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", flush_after_an_outage)
    redis_client.xadd(protocol.METRICS_STREAM, {"m": json.dumps({"v": 1, "kind": "node_sample", "node": "n1",
                                                                 "ts": T0, "seq": 0, "gpus": [
                                                                     {"index": 0, "temperature_c": "Infinity"}]})})
    publish(redis_client, sample(1, T0 + 1))
    with pytest.raises(OperationalError):
        ingestor.run_once()
    assert ingestor.run_once().samples == 1
    (letter,) = dead_letters(redis_client)
    assert b"temperature_c" in letter[b"reason"]
    assert pending(redis_client) == 0


def test_the_reported_infinite_temperature_is_dead_lettered_and_ingest_carries_on(ingestor, redis_client):
    # As the issue found it: a signed sample (the JSON an agent's json module writes for inf).
    hot = json.loads(protocol.encode(sample(1, T0 + 1))["m"])
    hot["gpus"][0]["temperature_c"] = float("inf")
    redis_client.xadd(protocol.METRICS_STREAM, {"m": json.dumps(hot), "sig": "00"})
    publish(redis_client, sample(2, T0 + 2))
    result = ingestor.run_once()
    assert (result.dead, result.samples) == (1, 1)
    assert b"finite" in dead_letters(redis_client)[0][b"reason"]
    assert samples_in_rollups() == 1


def test_ingest_does_not_exit_on_an_error_outside_the_samples(ingestor, monkeypatch):
    calls = []

    def run_once(block_ms=None):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug, not a sample")
        stop.set()

    stop = threading.Event()
    monkeypatch.setattr(ingestor, "run_once", run_once)
    monkeypatch.setattr(ingest, "DB_BACKOFF_FIRST_S", 0.01)
    ingestor.run_forever(stop, block_ms=10)
    assert len(calls) == 2


def test_tries_add_up_across_readers(redis_client):
    # A reader that died after failing on an entry does not give the next one a fresh budget.
    fields = {b"m": b"{}"}
    for _ in range(poison.MAX_TRIES - 1):
        assert PoisonCounter(redis_client, protocol.METRICS_STREAM, GROUP).failed("1-1", fields, ValueError("x"))
    assert not PoisonCounter(redis_client, protocol.METRICS_STREAM, GROUP).failed("1-1", fields, ValueError("x"))
    assert dead_letter_count(redis_client) == 1


def test_a_sample_at_every_bound_the_schema_allows_is_stored(ingestor, redis_client, settings):
    # The bounds must fit what stores them: no sample the schema accepts fails in the database.
    settings.COLONY_ALERT_TEMPERATURE_C = 85.0
    big = protocol.ID_MAX
    extreme = protocol.NodeSample(
        node="n1", ts=protocol.UNIX_TIME_MAX, seq=big,
        gpus=[protocol.GpuSample(index=0, util_sm=100.0, util_mem=100.0, mem_used_mib=protocol.MEMORY_MIB_MAX,
                                 mem_total_mib=protocol.MEMORY_MIB_MAX, temperature_c=protocol.TEMPERATURE_C_MAX,
                                 power_w=protocol.POWER_W_MAX, sm_clock_mhz=protocol.CLOCK_MHZ_MAX,
                                 mem_clock_mhz=protocol.CLOCK_MHZ_MAX, ecc_uncorrected=protocol.COUNTER_MAX,
                                 xid_events=[protocol.XID_MAX]),
              protocol.GpuSample(index=1, temperature_c=protocol.TEMPERATURE_C_MIN, power_w=0.0)],
        jobs=[protocol.JobGpuSample(job_id=big, gpu_index=0, mem_used_mib=protocol.MEMORY_MIB_MAX, util_sm=100.0)],
        unattributed_mib={63: protocol.MEMORY_MIB_MAX}, running_jobs=[big],
    )
    place_job(big, "n1")
    publish(redis_client, extreme)
    result = ingestor.run_once()
    assert (result.samples, result.dead) == (1, 0)
    bucket = GpuRollup.objects.get(gpu__index=0)
    assert (bucket.mem_max, bucket.temp_max) == (protocol.MEMORY_MIB_MAX, protocol.TEMPERATURE_C_MAX)
    from monitoring.models import Alert, JobUsage

    # A job's reading is clamped to its GPU's registered memory (tests/monitoring/test_usage_bounds.py).
    gpu_mib = bucket.gpu.memory_mib
    assert JobUsage.objects.get(job_id=big).peak_gpu_memory_mib == gpu_mib
    assert {alert.kind for alert in Alert.objects.all()} == {"xid", "thermal"}
