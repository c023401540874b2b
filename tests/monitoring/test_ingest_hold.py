"""A reader holding open 10 s buckets in memory (``hold_s`` > 0, what ``manage.py ingest`` runs):
each bucket is written once when it is over, or after ``hold_s``, or when the reader stops; job
usage is not held; an outage while writing keeps the rows; every sample lands exactly once."""

import threading

import pytest
from django.db import OperationalError
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitoring.choices import Resolution
from monitoring.models import GpuRollup, JobRollup, JobUsage
from monitoring.services import ingest
from monitoring.services.ingest import Ingestor
from monitoring.services.rollups import CLOSE_GRACE_S
from tests.monitoring.conftest import place_job
from tests.monitoring.test_ingest import T0, publish, rollup, sample

HOLD_S = 15.0


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock(T0 + 5)


@pytest.fixture
def holding(redis_client, live_redis, node_n1, clock):
    return Ingestor(redis_client, consumer="test", hold_s=HOLD_S, clock=clock)


@pytest.fixture
def flushes(monkeypatch):
    """Every accumulator ``flush`` was called with (after it was written)."""
    real_flush, calls = ingest.flush, []

    def flush(acc):
        real_flush(acc)
        calls.append(acc)

    monkeypatch.setattr(ingest, "flush", flush)
    return calls


def samples_in(bucket=T0) -> int:
    return GpuRollup.objects.filter(gpu__index=0, resolution=Resolution.TEN_SECONDS,
                                    bucket_start=rollup_dt(bucket)).aggregate(n=Sum("samples"))["n"] or 0


def rollup_dt(epoch):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def test_an_open_bucket_is_written_once_when_it_is_over(holding, redis_client, clock, flushes):
    for seq in range(1, 6):
        publish(redis_client, sample(seq, T0 + seq, util=(10.0 * seq, 0.0)))
        clock.now = T0 + seq + 0.5
        assert holding.run_once().samples == 1
    assert not GpuRollup.objects.exists()  # acknowledged, held
    clock.now = T0 + 10 + CLOSE_GRACE_S
    result = holding.run_once()
    assert [n for _, n in result.rollup_delays] == [10]  # 5 samples x 2 GPUs, in one write
    row = rollup(0)
    assert (row.samples, row.util_max, row.util_avg) == (5, 50.0, pytest.approx(30.0))
    assert len([acc for acc in flushes if acc.gpus]) == 1  # one write of the bucket, not one per batch


def test_job_usage_is_written_with_every_batch_while_its_bucket_is_held(holding, redis_client):
    place_job(7, "n1")
    publish(redis_client, sample(1, T0 + 1, jobs=[(7, 0, 4000, 90.0)]))
    holding.run_once()
    assert JobUsage.objects.get(job_id=7).peak_gpu_memory_mib == 4000  # the scheduler sees the peak now
    assert not JobRollup.objects.exists()
    holding.flush_open()
    assert JobRollup.objects.get(job_id=7).mem_max == 4000


def test_a_late_sample_is_written_at_once_and_merges_with_its_written_bucket(holding, redis_client, clock):
    publish(redis_client, sample(1, T0 + 1))
    holding.run_once()
    clock.now = T0 + 20
    publish(redis_client, sample(2, T0 + 9))  # late: its bucket is over and written
    holding.run_once()
    assert samples_in(T0) == 2


def test_a_bucket_dated_ahead_of_this_clock_is_written_after_hold_s(holding, redis_client, clock):
    publish(redis_client, sample(1, T0 + 300))  # a node whose clock runs 5 min ahead
    holding.run_once()
    clock.now += HOLD_S - 1
    holding.run_once()
    assert samples_in(T0 + 300) == 0
    clock.now += 1
    holding.run_once()
    assert samples_in(T0 + 300) == 1


def test_a_stopping_reader_writes_what_it_holds(holding, redis_client):
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2))
    stop = threading.Event()

    def run_once(block_ms=None, real=holding.run_once):
        result = real()
        stop.set()
        return result

    holding.run_once = run_once
    holding.run_forever(stop, block_ms=10)
    assert samples_in(T0) == 2


def test_an_outage_while_writing_held_rows_keeps_them_and_writes_each_once(holding, redis_client, clock,
                                                                           monkeypatch):
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2))
    holding.run_once()
    real_flush = ingest.flush

    def down(acc):
        raise OperationalError("connection refused")

    monkeypatch.setattr(ingest, "flush", down)
    clock.now = T0 + 30
    publish(redis_client, sample(3, T0 + 25))
    with pytest.raises(OperationalError):
        holding.run_once()  # nothing read while the held rows cannot be written
    monkeypatch.setattr(ingest, "flush", real_flush)
    holding.run_once()
    holding.flush_open()
    assert (samples_in(T0), samples_in(T0 + 20)) == (2, 1)


def test_held_rows_the_database_refuses_are_dropped_and_the_rest_written(holding, redis_client, clock,
                                                                         monkeypatch, node_n1):
    from tests.factories import GpuFactory, NodeFactory

    GpuFactory(node=NodeFactory(name="n2"), index=0, uuid="GPU-n2-0")
    publish(redis_client, sample(1, T0 + 1), sample(1, T0 + 1, node="n2"))
    holding.run_once()
    real_flush = ingest.flush
    refused_gpu = holding.gpu_ids.get("n2", 0)

    def refusing(acc):
        if any(gpu_id == refused_gpu for gpu_id, _ in acc.gpus):
            raise ValueError("value out of range")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", refusing)
    clock.now = T0 + 20
    holding.run_once()
    assert not holding.open
    assert set(GpuRollup.objects.values_list("gpu__node__name", flat=True)) == {"n1"}
    assert ingest.ingest_stats(redis_client)["rollup_rows_dropped"] == 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 45), st.integers(1, 4), st.floats(0, 8)), min_size=1, max_size=12))
def test_every_sample_lands_in_its_bucket_exactly_once(redis_client, live_redis, node_n1, steps):
    """Batches of samples, the clock moving on between them, sometimes dated in a bucket already
    written: once the reader stops, each bucket holds exactly the samples published into it."""
    GpuRollup.objects.all().delete()
    redis_client.flushdb()
    clock = Clock(T0)
    reader = Ingestor(redis_client, consumer="prop", hold_s=HOLD_S, clock=clock)
    expected, seq, newest = {}, 0, T0
    for offset, count, advance in steps:
        for i in range(count):
            seq += 1
            # Strictly newer per node: older ones are dropped as repeats (test_ingest covers that).
            newest = max(newest + 0.01, T0 + offset + i * 0.01)
            publish(redis_client, sample(seq, newest))
            bucket = int(newest // 10 * 10)
            expected[bucket] = expected.get(bucket, 0) + 1
        clock.now = max(clock.now, newest - 3) + advance
        reader.run_once()
    reader.flush_open()
    got = dict(GpuRollup.objects.filter(gpu__index=0).values_list("bucket_start").annotate(n=Sum("samples")))
    assert {int(start.timestamp()): n for start, n in got.items()} == expected
