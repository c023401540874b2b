"""/metrics speaks the Prometheus text format, for Grafana users."""

import time

from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from jobs.choices import JobState
from monitoring.services import live
from tests.factories import GpuFactory, JobFactory


def scrape(client, **headers):
    response = client.get("/metrics", **headers)
    return response, {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def test_metrics_expose_cluster_gpu_and_job_gauges(client, db, live_redis, redis_client):
    GpuFactory(node__name="n1", index=0, model="H100-80GB")
    JobFactory(state=JobState.RUNNING)
    live.store_latest(redis_client, [protocol.NodeSample(
        node="n1", ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=0, util_sm=42.0, mem_used_mib=1000, temperature_c=55.0)])])
    redis_client.incr(protocol.DEAD_LETTER_COUNT_KEY, 3)
    response, families = scrape(client)
    assert response.status_code == 200
    util = families["colony_gpu_utilization_percent"].samples[0]
    assert util.labels == {"node": "n1", "gpu": "0", "model": "H100-80GB"} and util.value == 42.0
    jobs = {s.labels["state"]: s.value for s in families["colony_jobs"].samples}
    assert jobs["RUNNING"] == 1
    assert families["colony_dead_letters"].samples[0].value == 3
    assert "colony_ingest_lag_seconds" in families


def test_metrics_token_when_configured(client, db, live_redis, settings):
    settings.COLONY_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_metrics_count_fenced_reports_and_fan_in(client, db, live_redis, redis_client):
    """Operators see fencing and the nodes' streams at work: reports about an earlier attempt
    ignored, entries fanned in, malformed ones rejected at fan-in."""
    from jobs.services import lifecycle
    from monitoring.services import fanin

    redis_client.incr(lifecycle.IGNORED_REPORTS_KEY, 2)
    redis_client.xadd(protocol.node_events_stream("n1"), {"m": "{}"})
    redis_client.xadd(protocol.node_events_stream("n1"), {"m": "{}", "extra": "1"})
    fanin.fan_in(redis_client, "events")
    _, families = scrape(client)
    assert families["colony_lifecycle_ignored_reports"].samples[0].value == 2
    fanned = {(s.labels["stream"], s.labels["outcome"]): s.value for s in families["colony_fanin_entries"].samples}
    assert fanned[("events", "copied")] == 1 and fanned[("events", "rejected")] == 1


def test_gpus_allocated_counts_gpus_not_the_jobs_packed_on_them(client, db, live_redis):
    """Two jobs sharing one GPU are one allocated GPU (the review saw 25 on a 24-GPU cluster)."""
    from jobs.models import Allocation

    gpu = GpuFactory(node__name="n1", index=0)
    for _ in range(2):
        Allocation.objects.create(job=JobFactory(state=JobState.RUNNING, gpu_milli=500), gpu=gpu, gpu_milli=500)
    _, families = scrape(client)
    assert families["colony_gpus_allocated"].samples[0].value == 1


def test_metrics_show_notifications_by_state_and_the_events_that_could_not_be_recorded(client, db, live_redis,
                                                                                      redis_client):
    from jobs.models import Notification
    from jobs.services import notifications
    from tests.factories import JobFactory

    job = JobFactory()
    for n, state in enumerate(("sent", "sent", "failed")):
        Notification.objects.create(user=job.owner, job=job, event="failed", channel="email", state=state,
                                    dedupe_key=f"k{n}")
    redis_client.incr(notifications.ERRORS_KEY, 3)
    _, families = scrape(client)
    by_state = {s.labels["state"]: s.value for s in families["colony_notifications"].samples}
    assert by_state == {"pending": 0, "sent": 2, "failed": 1}
    assert families["colony_notification_errors"].samples[0].value == 3


def test_metrics_say_how_the_scheduling_loop_runs(client, db, live_redis):
    from jobs.services.scheduling_loop import run_scheduling_cycle

    _, families = scrape(client)
    assert families["colony_scheduler_cycles"].samples[0].value == 0
    assert "colony_scheduler_last_cycle_timestamp_seconds" not in families  # no cycle yet: nothing to age
    for _ in range(2):
        assert run_scheduling_cycle().ran
    _, families = scrape(client)
    assert families["colony_scheduler_cycles"].samples[0].value == 2
    assert families["colony_scheduler_cycle_seconds"].samples[0].value > 0
    assert abs(families["colony_scheduler_last_cycle_timestamp_seconds"].samples[0].value - time.time()) < 60
    assert families["colony_scheduler_backed_off"].samples[0].value == 0
    # Where the cycles' time went, stage by stage; the stages of one cycle add up to (about) all of it.
    stages = {s.labels["stage"]: s.value for s in families["colony_scheduler_stage_seconds"].samples}
    assert set(stages) == {"usage", "snapshot", "decide", "apply", "resend"}
    assert all(seconds > 0 for seconds in stages.values())
    assert sum(stages.values()) <= families["colony_scheduler_cycle_seconds"].samples[0].value
    last = {s.labels["stage"]: s.value for s in families["colony_scheduler_last_cycle_stage_seconds"].samples}
    assert set(last) == set(stages)
    assert sum(last.values()) <= families["colony_scheduler_last_cycle_seconds"].samples[0].value


def test_a_garbled_counter_in_redis_costs_its_own_series_not_the_scrape(client, db, live_redis, redis_client):
    """Counters the control plane keeps in Redis hashes are read back as numbers; a field some
    other writer garbled (text, NaN) is left out, and everything else is still exported."""
    from jobs.services.lifecycle import IGNORED_REPORTS_KEY
    from jobs.services.scheduling_loop import STATS_KEY, run_scheduling_cycle
    from monitoring.services import fanin, ingest

    assert run_scheduling_cycle().ran
    redis_client.hset(STATS_KEY, mapping={"placed": "lots", "last_cycle_seconds": "nan", "cycle_seconds": "7.5"})
    redis_client.hset(ingest.STATS_KEY, mapping={"samples": "12", "lag_p50": "\xff garbage"})
    redis_client.hset(ingest.LAST_TS_KEY, mapping={"n1": "1700000000.5", "n2": "yesterday"})
    redis_client.hset(fanin.STATS_KEY, mapping={"events_copied": "3", "events_rejected": "[1]"})
    redis_client.set(IGNORED_REPORTS_KEY, "x")
    response, families = scrape(client)
    assert response.status_code == 200
    value = lambda name: families[name].samples[0].value  # noqa: E731
    assert value("colony_scheduler_cycles") == 1 and value("colony_scheduler_cycle_seconds") == 7.5
    assert value("colony_scheduler_placements") == 0  # garbled: as if never counted
    assert "colony_scheduler_last_cycle_seconds" not in families  # NaN: not a reading
    assert value("colony_ingest_samples") == 12 and value("colony_ingest_lag_seconds") == 0
    newest = {s.labels["node"]: s.value for s in families["colony_node_last_sample_timestamp_seconds"].samples}
    assert newest == {"n1": 1700000000.5}
    fanned = {(s.labels["stream"], s.labels["outcome"]): s.value for s in families["colony_fanin_entries"].samples}
    assert fanned[("events", "copied")] == 3 and fanned[("events", "rejected")] == 0
    assert value("colony_lifecycle_ignored_reports") == 0
