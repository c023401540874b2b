"""The web and scheduler-lease alerts of monitoring/prometheus/colony-alerts.yml fire on the series
that should fire them and stay quiet on those that should not: ``promtool test rules`` evaluates
them, as Prometheus would, over made-up series with the names and labels /metrics exports.

Annotations are left out of the copy under test: promtool compares them verbatim, and what is
tested here is the expressions (test_alert_rules.py checks the annotations are there)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.monitoring.test_alert_rules import RULES

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")

RESPONSES = "django_http_responses_total_by_status_view_method_total"


def responses(status: str, view: str, per_minute: int) -> dict:
    return {"series": f'{RESPONSES}{{status="{status}",view="{view}",method="GET"}}',
            "values": f"0+{per_minute}x30"}


def fires(name: str, severity: str, at: str, **labels) -> dict:
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": {"severity": severity, **labels}}]}


def quiet(name: str, at: str) -> dict:
    return {"eval_time": at, "alertname": name, "exp_alerts": []}


CASES = {
    "ten percent of a busy server's responses are 500s": (
        [responses("200", "api-job-list", 540), responses("500", "heatmap", 60)],
        [fires("ColonyHttp5xxRatio", "critical", "15m")]),
    "one percent is noise": (
        [responses("200", "api-job-list", 594), responses("500", "heatmap", 6)],
        [quiet("ColonyHttp5xxRatio", "15m")]),
    "a few requests a minute, some failing, are too few to page for": (
        [responses("200", "login", 2), responses("503", "heatmap", 1)],
        [quiet("ColonyHttp5xxRatio", "15m")]),
    "4xx are the clients' errors, not the server's": (
        [responses("200", "login", 300), responses("404", "<unnamed view>", 300)],
        [quiet("ColonyHttp5xxRatio", "15m")]),
    "a takeover warns, and stops warning once it is 15 minutes old": (
        [{"series": "colony_scheduler_lease_takeovers_total", "values": "0 0 0 1x30"}],
        [fires("ColonySchedulerTakeover", "warning", "5m"), quiet("ColonySchedulerTakeover", "25m")]),
    "a fenced cycle warns": (
        [{"series": "colony_scheduler_fenced_cycles_total", "values": "0 0 2x30"}],
        [fires("ColonySchedulerFencedCycles", "warning", "4m"), quiet("ColonySchedulerFencedCycles", "1m")]),
    "the lease changing hands every minute is flapping": (
        [{"series": "colony_scheduler_leader_epoch", "values": "1 2 3 4 5 5 5"}],
        [fires("ColonySchedulerLeaderFlapping", "warning", "6m")]),
    "one change of holder (a restart) is not": (
        [{"series": "colony_scheduler_leader_epoch", "values": "1 1 2 2 2 2 2"}],
        [quiet("ColonySchedulerLeaderFlapping", "6m")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_alert_fires_or_not(case, tmp_path):
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(document))
    series, checks = CASES[case]
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                    "tests": [{"interval": "1m", "input_series": series,
                                               "alert_rule_test": checks}]}))
    result = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
