"""monitoring/prometheus/colony-alerts.yml: valid rules, each over series the real ``/metrics``
exports, and accepted by ``promtool check rules`` where promtool is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.test_grafana_dashboard import exported_series, missing_series, populate_cluster, \
    promql_metric_names

RULES = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "colony-alerts.yml"
# Made by Prometheus itself for every scrape target, never by an exporter.
PROMETHEUS_SERIES = {"up"}
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_rules_file_is_prometheus_shaped(rules):
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    names = [g["name"] for g in document["groups"]]
    assert len(names) == len(set(names))
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)), "alert names must be unique"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert rule["expr"].strip() and rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_rules_cover_what_operators_are_told_about(rules):
    read = set().union(*(promql_metric_names(r["expr"]) for r in rules))
    assert {"colony_nodes", "colony_alerts_open", "colony_gpu_temperature_celsius", "colony_dead_letters_total",
            "colony_ingest_lag_seconds", "colony_ingest_last_batch_timestamp_seconds", "colony_notifications",
            "colony_notification_errors_total", "colony_scheduler_lease_takeovers_total",
            "colony_scheduler_fenced_cycles_total", "colony_scheduler_leader_epoch",
            "django_http_responses_total_by_status_view_method_total"} <= read
    kinds = " ".join(r["expr"] for r in rules)
    for kind in ('kind="xid"', 'kind="idle_gpu"', 'state="LOST"'):
        assert kind in kinds


def test_every_rule_reads_series_metrics_exports(rules, client, db, live_redis, redis_client, settings):
    settings.COLONY_METRICS_TOKEN = ""
    populate_cluster(redis_client)
    exported = exported_series(client) | PROMETHEUS_SERIES
    exprs = [r["expr"] for r in rules]
    assert all(promql_metric_names(e) for e in exprs)
    assert missing_series(exprs, exported) == {}
    # ...and that check bites: a rule on a series nobody exports is reported.
    assert missing_series(["rate(colony_scheduler_naps_total[5m]) == 0"], exported) == {
        "rate(colony_scheduler_naps_total[5m]) == 0": {"colony_scheduler_naps_total"}}


# What an operator is paged for and has to act on: each says what to look at, in steps.
RUNBOOK_ALERTS = {"ColonyHttp5xxRatio", "ColonyHttpSlow", "ColonySchedulerTakeover", "ColonySchedulerFencedCycles",
                  "ColonySchedulerLeaderFlapping", "ColonyIngestLagging", "ColonyIngestStalled",
                  "ColonyDeadLettersGrowing"}


def test_paging_alerts_carry_a_runbook(rules):
    by_name = {rule["alert"]: rule for rule in rules}
    assert RUNBOOK_ALERTS <= set(by_name)
    for name in RUNBOOK_ALERTS:
        runbook = by_name[name]["annotations"].get("runbook", "")
        assert "1. " in runbook and "2. " in runbook, name


def test_the_5xx_alert_reads_server_errors_of_every_view(rules):
    """Summed over views and workers, 5xx against all responses: not one view's, not a raw path's."""
    expr = next(rule["expr"] for rule in rules if rule["alert"] == "ColonyHttp5xxRatio")
    assert 'status=~"5.."' in expr and "path" not in expr
    assert "django_http_responses_total_by_status_view_method_total" in promql_metric_names(expr)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
