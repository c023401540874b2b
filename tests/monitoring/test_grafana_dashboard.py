"""monitoring/grafana/colony.json: importable by Grafana 10+, and every query in it names a series
that the real ``/metrics`` exports (scraped after a little real data went through ingest).

The PromQL helpers here are shared with ``test_alert_rules.py``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "monitoring" / "grafana" / "colony.json"

# Words PromQL gives meaning to that are not series: aggregation modifiers, set and comparison
# operators, and the literals a bare word can be.
PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "atan2", "inf", "nan",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
# `by (node, gpu)` and `on () group_left (model)` list label names, not series.
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_OFFSET = re.compile(r"\boffset\s+-?\w+", re.IGNORECASE)
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (functions, keywords and labels left out)."""
    text = _GRAFANA_VARIABLE.sub(" 1 ", expr)  # before strings: `"$node"` must stay a string
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def missing_series(exprs, exported: set[str]) -> dict[str, set[str]]:
    """expr -> the names it reads that ``exported`` lacks (only exprs with some missing)."""
    missing = {}
    for expr in exprs:
        absent = promql_metric_names(expr) - exported
        if absent:
            missing[expr] = absent
    return missing


def exported_series(client) -> set[str]:
    """Every sample name the ``/metrics`` endpoint serves now (``_total`` suffixes included).

    The HTTP series by view and status have samples once a request was answered (a fresh worker
    has none yet), so one page is requested first."""
    assert client.get("/accounts/login/").status_code == 200
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:200]
    return {sample.name for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


RUNNING_JOB = 9_000_007


def populate_cluster(redis_client) -> None:
    """A little of everything, through the real paths where there is one: a node with a running job
    and a pending one, a hot GPU with an XID sample run through ingest, a lost node, a fenced
    report, a fan-in, a dead letter and notifications in each state."""
    from jobs.choices import JobState
    from jobs.models import Notification
    from jobs.services import launch_failures, lifecycle, notifications
    from monitoring.choices import NodeHealth
    from monitoring.services import fanin
    from monitoring.services.ingest import Ingestor
    from tests.factories import GpuFactory, JobFactory, NodeFactory
    from tests.monitoring.conftest import place_job

    from jobs.services.scheduling_loop import run_scheduling_cycle

    run_scheduling_cycle()  # the loop's series exist once a cycle ran
    node = NodeFactory(name="n1")
    for index in (0, 1):
        GpuFactory(node=node, index=index, uuid=f"GPU-n1-{index}", model="A100-80GB")
    NodeFactory(name="n2", state=NodeHealth.LOST)
    # An id far above the sequence: JobFactory below must not be handed the same one (PostgreSQL
    # sequences do not roll back with a test, so a small id collided once other tests had run).
    running = place_job(RUNNING_JOB, "n1", 0)
    running.state = JobState.RUNNING
    running.save(update_fields=["state"])
    JobFactory(state=JobState.PENDING)
    sample = protocol.NodeSample(
        node="n1", ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=i, util_sm=(80.0, 0.0)[i], mem_used_mib=4000, mem_total_mib=81920,
                                 temperature_c=95.0, power_w=300.0, xid_events=[79] if i == 0 else [])
              for i in (0, 1)],
        jobs=[protocol.JobGpuSample(job_id=RUNNING_JOB, gpu_index=0, mem_used_mib=4000, util_sm=80.0)],
        running_jobs=[RUNNING_JOB],
    )
    redis_client.xadd(protocol.METRICS_STREAM, protocol.encode(sample))
    assert Ingestor(redis_client, consumer="test").run_once().samples == 1
    redis_client.xadd(protocol.node_events_stream("n1"), {"m": "{}"})
    fanin.fan_in(redis_client, "events")
    redis_client.incr(protocol.DEAD_LETTER_COUNT_KEY)
    redis_client.incr(lifecycle.IGNORED_REPORTS_KEY)
    redis_client.hincrby(launch_failures.FLAGGED_KEY, "n1", 1)
    redis_client.incr(notifications.ERRORS_KEY)
    for n, state in enumerate(Notification.State.values):
        Notification.objects.create(user=running.owner, job=running, event="failed", channel="email", state=state,
                                    dedupe_key=f"dashboard-{n}")


@pytest.fixture
def exported(client, db, live_redis, redis_client, settings):
    settings.COLONY_METRICS_TOKEN = ""
    populate_cluster(redis_client)
    return exported_series(client)


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets (rows' nested panels included) and
    query variables (``label_values(METRIC, label)`` reads METRIC)."""
    exprs = []

    def walk(panels):
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        values_of = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
        exprs.append(values_of.group(1) if values_of else query)
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_dashboard_query_names_a_series_metrics_exports(dashboard, exported):
    exprs = dashboard_queries(dashboard)
    assert len(exprs) > 20
    assert all(promql_metric_names(e) for e in exprs), [e for e in exprs if not promql_metric_names(e)]
    assert missing_series(exprs, exported) == {}


def test_a_query_naming_a_series_metrics_lacks_is_caught(dashboard, exported):
    """The check above can fail: the dashboard with one panel renamed to a series nobody exports."""
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][1]["targets"][0]["expr"] = "colony_gpus_allocated / sum(colony_gpu_count)"
    assert missing_series(dashboard_queries(broken), exported) == {
        "colony_gpus_allocated / sum(colony_gpu_count)": {"colony_gpu_count"}}


def test_dashboard_covers_what_operators_ask_for(dashboard):
    names = set().union(*(promql_metric_names(e) for e in dashboard_queries(dashboard)))
    for series in ("colony_gpus_allocated", "colony_gpus", "colony_gpu_utilization_percent", "colony_jobs",
                   "colony_ingest_lag_seconds", "colony_fanin_entries_total", "colony_dead_letters_total",
                   "colony_notifications", "colony_alerts_open", "colony_nodes",
                   # the scheduler's lease (fencing, takeovers, leader) and the web server
                   "colony_scheduler_lease_takeovers_total", "colony_scheduler_fenced_cycles_total",
                   "colony_scheduler_leader_epoch", "colony_scheduler_leader",
                   "django_http_responses_total_by_status_view_method_total",
                   "django_http_requests_latency_seconds_by_view_method_bucket",
                   "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert series in names


def test_dashboard_is_importable_with_a_prometheus_input(dashboard):
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    ids = []

    def walk(panels):
        for panel in panels:
            ids.append(panel["id"])
            assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
                assert panel["targets"], panel["title"]
                for target in panel["targets"]:
                    assert target["datasource"]["uid"] == "${DS_PROMETHEUS}" and target["refId"]
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@pytest.mark.parametrize("expr, names", [
    ('sum by (node, gpu) (rate(colony_a_total{node=~"$node"}[5m] offset 1h))', {"colony_a_total"}),
    ("colony_a / on() group_left(model) colony_b", {"colony_a", "colony_b"}),
    ('count(colony_a >= $idle_util) or vector(0)', {"colony_a"}),
    ('time() - colony_a{state="by"} > 1e3', {"colony_a"}),
    ("histogram_quantile(0.9, sum without (le) (rate(colony_h_bucket[$__rate_interval])))", {"colony_h_bucket"}),
    ("max_over_time(colony_a[10m:1m]) and colony_b unless colony_c", {"colony_a", "colony_b", "colony_c"}),
])
def test_promql_names_leave_out_functions_labels_and_keywords(expr, names):
    assert promql_metric_names(expr) == names


def test_metrics_show_ingest_age_per_node_and_every_alert_kind(client, db, live_redis, redis_client, settings):
    """The series the dashboard and rules lean on beyond the original set: how old the newest
    batch and each node's newest sample are (lags alone freeze when ingest stops), and open alerts
    for every kind, zero included, so a rule on a kind never raised reads 0 rather than nothing."""
    settings.COLONY_METRICS_TOKEN = ""
    before = time.time()
    populate_cluster(redis_client)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    assert before <= families["colony_ingest_last_batch_timestamp_seconds"].samples[0].value <= time.time()
    newest = {s.labels["node"]: s.value for s in families["colony_node_last_sample_timestamp_seconds"].samples}
    assert list(newest) == ["n1"] and before - 1 <= newest["n1"] <= time.time()
    assert (families["colony_ingest_lag_max_seconds"].samples[0].value
            >= families["colony_ingest_lag_seconds"].samples[0].value)
    open_alerts = {s.labels["kind"]: s.value for s in families["colony_alerts_open"].samples}
    assert open_alerts == {"idle_gpu": 0, "xid": 1, "thermal": 2, "memory_over_request": 0, "node_lost": 0}


def test_no_batch_ingested_yet_exports_no_batch_time(client, db, live_redis, settings):
    """Never ingested: no timestamp at all (a 0 would read as "stalled for 56 years")."""
    settings.COLONY_METRICS_TOKEN = ""
    assert "colony_ingest_last_batch_timestamp_seconds" not in exported_series(client)
