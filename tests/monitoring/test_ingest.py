"""Metric ingest: node samples on the stream -> live values in Redis and 10 s rollups."""

import time

import pytest

from agents import protocol
from monitoring.choices import AlertKind, Resolution
from monitoring.models import Alert, GpuRollup, JobRollup, JobUsage
from monitoring.services import live
from monitoring.services.ingest import GROUP, Ingestor, ingest_stats
from tests.monitoring.conftest import place_job

T0 = 1_700_000_000.0  # a bucket boundary (divisible by 10)


def sample(seq, ts, node="n1", util=(50.0, 10.0), mem=(1000, 2000), temp=60.0, jobs=(), xid=()):
    return protocol.NodeSample(
        node=node, ts=ts, seq=seq,
        gpus=[protocol.GpuSample(index=i, util_sm=util[i], mem_used_mib=mem[i], mem_total_mib=81920,
                                 temperature_c=temp, power_w=200.0, xid_events=list(xid) if i == 0 else [])
              for i in range(2)],
        jobs=[protocol.JobGpuSample(job_id=j, gpu_index=g, mem_used_mib=m, util_sm=u) for j, g, m, u in jobs],
        running_jobs=sorted({j for j, *_ in jobs}),
    )


def publish(redis_client, *samples):
    for s in samples:
        redis_client.xadd(protocol.METRICS_STREAM, protocol.encode(s))


@pytest.fixture
def ingestor(redis_client, live_redis, node_n1):
    return Ingestor(redis_client, consumer="test")


def rollup(gpu_index, bucket=T0):
    return GpuRollup.objects.get(gpu__index=gpu_index, resolution=Resolution.TEN_SECONDS,
                                 bucket_start__year__gte=2000, bucket_start=_dt(bucket))


def _dt(epoch):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def test_samples_fold_into_ten_second_buckets(ingestor, redis_client):
    publish(redis_client, sample(1, T0 + 1, util=(40.0, 0.0)), sample(2, T0 + 2, util=(60.0, 0.0)),
            sample(3, T0 + 11, util=(90.0, 0.0)))
    result = ingestor.run_once()
    assert (result.entries, result.samples, result.dead) == (3, 3, 0)
    first = rollup(0)
    assert first.samples == 2
    assert first.util_avg == pytest.approx(50.0)
    assert first.util_max == 60.0
    assert first.mem_max == 1000
    assert first.power_avg == pytest.approx(200.0)
    assert rollup(0, T0 + 10).util_avg == pytest.approx(90.0)


def test_partial_buckets_from_separate_batches_merge(ingestor, redis_client):
    publish(redis_client, sample(1, T0 + 1, util=(20.0, 0.0), mem=(500, 0)))
    ingestor.run_once()
    publish(redis_client, sample(2, T0 + 2, util=(80.0, 0.0), mem=(3000, 0)))
    ingestor.run_once()
    merged = rollup(0)
    assert (merged.samples, merged.util_avg, merged.util_max, merged.mem_max) == (2, 50.0, 80.0, 3000)


def test_unknown_readings_are_not_counted_as_zero(ingestor, redis_client):
    reading = protocol.NodeSample(node="n1", ts=T0 + 1, seq=1, gpus=[protocol.GpuSample(index=0)])
    publish(redis_client, reading, sample(2, T0 + 2, util=(70.0, 0.0)))
    ingestor.run_once()
    bucket = rollup(0)
    assert bucket.samples == 2
    assert bucket.util_n == 1
    assert bucket.util_avg == pytest.approx(70.0)


def test_job_memory_is_rolled_up_and_its_peak_recorded(ingestor, redis_client):
    place_job(7, "n1")
    publish(redis_client,
            sample(1, T0 + 1, jobs=[(7, 0, 4000, 90.0), (7, 1, 5000, 80.0)]),
            sample(2, T0 + 2, jobs=[(7, 0, 6000, 95.0), (7, 1, 5500, 85.0)]))
    ingestor.run_once()
    job = JobRollup.objects.get(job_id=7, resolution=Resolution.TEN_SECONDS)
    assert job.mem_max == 6000
    assert job.util_avg == pytest.approx(87.5)
    usage = JobUsage.objects.get(job_id=7)
    assert usage.peak_gpu_memory_mib == 6000
    publish(redis_client, sample(3, T0 + 30, jobs=[(7, 0, 3000, 50.0)]))
    ingestor.run_once()
    assert JobUsage.objects.get(job_id=7).peak_gpu_memory_mib == 6000  # a peak only grows


def test_latest_values_are_kept_in_redis(ingestor, redis_client):
    import time

    now = time.time()
    publish(redis_client, sample(1, now - 2, util=(10.0, 0.0)), sample(2, now - 1, util=(77.0, 0.0),
                                                                    jobs=[(3, 1, 1234, None)]))
    ingestor.run_once()
    assert live.latest_gpus(redis_client)["n1:0"]["util_sm"] == 77.0
    assert live.latest_jobs(redis_client)[3]["gpus"][1]["mem_used_mib"] == 1234
    assert live.latest_nodes(redis_client)["n1"]["running_jobs"] == [3]


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"m": '{"v": 2, "kind": "node_sample"}'}, "v"),
        ({"m": '{"v": 1, "kind": "node_sample", "node": "n1", "seq": 1, "gpus": []}'}, "ts"),
        ({"m": "{}" + " " * protocol.MAX_MESSAGE_BYTES}, "exceeds"),
        ({"m": b"\xc3\x28 not utf-8"}, "not UTF-8"),
        ({"m": '{"v": 1, "kind": "node_sample", "node": "n1", "ts": 1, "seq": 1, '
               '"gpus": [{"index": 0, "util_sm": 250}]}'}, "less than or equal to 100"),
    ],
)
def test_malformed_samples_are_dead_lettered_and_change_nothing(ingestor, redis_client, fields, reason):
    redis_client.xadd(protocol.METRICS_STREAM, fields)
    result = ingestor.run_once()
    assert result.dead == 1
    (letter,) = [f for _, f in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]
    assert reason in letter[b"reason"].decode()
    assert not GpuRollup.objects.exists()
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 0


def test_samples_of_an_unregistered_node_are_counted_not_stored(ingestor, redis_client):
    publish(redis_client, sample(1, T0 + 1, node="stranger"))
    assert ingestor.run_once().unknown_node == 1
    assert not GpuRollup.objects.exists()
    assert ingest_stats(redis_client)["unknown_node"] == 1


def test_a_failed_write_leaves_the_batch_pending_for_another_reader(ingestor, redis_client, monkeypatch):
    from django.db import OperationalError

    from monitoring.services import ingest as ingest_module

    publish(redis_client, sample(1, T0 + 1))

    def broken(acc):
        raise OperationalError("database went away")

    monkeypatch.setattr(ingest_module, "flush", broken)
    with pytest.raises(OperationalError):
        ingestor.run_once()
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 1
    monkeypatch.undo()
    # Another reader claims what the dead one left (idle time shortened for the test).
    monkeypatch.setattr(ingest_module, "CLAIM_IDLE_MS", 0)
    other = Ingestor(redis_client, consumer="other")
    assert other.run_once().samples == 1
    assert rollup(0).samples == 1
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 0


def test_xid_and_heat_raise_alerts_once_per_gpu(ingestor, redis_client, settings):
    settings.COLONY_ALERT_TEMPERATURE_C = 85.0
    publish(redis_client, sample(1, T0 + 1, temp=91.0, xid=[79]), sample(2, T0 + 2, temp=92.0))
    ingestor.run_once()
    xid = Alert.objects.get(kind=AlertKind.XID)
    assert "XID 79 on n1/gpu0" in xid.message
    thermal = Alert.objects.filter(kind=AlertKind.THERMAL, resolved_at__isnull=True)
    assert thermal.count() == 2  # both GPUs are hot, one alert each despite two samples


def test_samples_resent_after_a_reconnect_are_not_counted_twice(ingestor, redis_client):
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2))
    ingestor.run_once()
    publish(redis_client, sample(2, T0 + 2), sample(3, T0 + 3))  # the agent's buffer repeats seq 2
    result = ingestor.run_once()
    assert (result.samples, result.duplicates) == (1, 1)
    assert rollup(0).samples == 3


def test_reader_carries_on_after_redis_restarts_empty(ingestor, redis_client):
    publish(redis_client, sample(1, T0 + 1))
    assert ingestor.run_once().samples == 1  # acknowledged: in the database before Redis goes
    redis_client.flushall()  # what a restart of a Redis that keeps nothing on disk looks like
    assert ingestor.run_once().entries == 0
    publish(redis_client, sample(2, T0 + 2))
    assert ingestor.run_once().samples == 1
    assert rollup(0).samples == 2


def test_a_batch_the_database_refused_stays_unacked_and_is_applied_once_it_returns(ingestor, redis_client,
                                                                                  monkeypatch):
    from django.db import OperationalError

    from monitoring.services import ingest

    real_flush, failures = ingest.flush, []

    def flaky_flush(acc):
        if len(failures) < 2:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        real_flush(acc)

    monkeypatch.setattr(ingest, "flush", flaky_flush)
    monkeypatch.setattr(ingest, "DB_BACKOFF_FIRST_S", 0.05)
    publish(redis_client, sample(1, T0 + 1), sample(2, T0 + 2))
    with pytest.raises(OperationalError):
        ingestor.run_once()
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 2  # unacked, not lost

    class UntilDrained:  # run_forever's stop event: set once nothing is pending (or after 10 s)
        deadline = time.monotonic() + 10

        def is_set(self):
            return not redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] or \
                time.monotonic() > self.deadline

        def wait(self, seconds):
            time.sleep(seconds)

    ingestor.run_forever(UntilDrained(), block_ms=50)  # fails once more, backs off, then commits the batch
    assert len(failures) == 2
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 0
    assert rollup(0).samples == 2  # each sample once


def test_a_node_cannot_report_usage_for_a_job_placed_elsewhere(ingestor, redis_client):
    """A node's key speaks for that node only: its figures for another node's job (a 500,000 MiB
    peak that would poison the job's profile) are dropped and counted; its own GPUs still count."""
    from tests.factories import GpuFactory, NodeFactory

    GpuFactory(node=NodeFactory(name="n2"), index=0, uuid="GPU-n2-0")
    place_job(7, "n2")
    publish(redis_client, sample(1, T0 + 1, jobs=[(7, 0, 500_000, 100.0)]),  # n1 lies about job 7
            sample(1, T0 + 1, node="n2", jobs=[(7, 0, 3000, 60.0)]))
    result = ingestor.run_once()
    assert (result.samples, result.foreign_usage) == (2, 1)
    assert JobUsage.objects.get(job_id=7).peak_gpu_memory_mib == 3000
    assert ingest_stats(redis_client)["foreign_usage"] == 1
    assert GpuRollup.objects.filter(gpu__node__name="n1").exists()  # n1's own GPU readings are kept
