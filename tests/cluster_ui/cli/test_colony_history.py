"""``colony history`` against a live server: the caller's finished jobs, newest finished first,
with runtime, GPU-hours and use measured against the request; ``--limit`` and ``--since``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone

from cluster_ui.cli.history import since_time
from cluster_ui.cli.client import Usage
from jobs.choices import JobState
from monitoring.models import JobUsage
from tests.factories import JobFactory
from tests.cluster_ui.cli.helpers import point_at, run


@pytest.fixture
def colony(live_server, transactional_db, monkeypatch, tmp_path, alice):
    point_at(monkeypatch, tmp_path, live_server.url, alice)
    return monkeypatch


def finished(tenant, owner, name, state, ran: timedelta, ended_ago: timedelta, **fields):
    end = django_timezone.now() - ended_ago
    return JobFactory(tenant=tenant, owner=owner, name=name, state=state, started_at=end - ran, finished_at=end,
                      **fields)


def test_history_lists_my_finished_jobs_with_their_cost_and_use(colony, capsys, alice, bob, charlie, vision):
    train = finished(vision, alice, "train", JobState.SUCCEEDED, timedelta(hours=2), timedelta(hours=1), gpus=4,
                     gpu_memory_mib=40960, peak_gpu_memory_mib=20480)
    JobUsage.objects.create(job_id=train.pk, peak_gpu_memory_mib=20480, util_sum=2 * 25.0, util_n=2,
                            first_seen_at=train.started_at, last_seen_at=train.finished_at)
    small = finished(vision, alice, "small", JobState.FAILED, timedelta(minutes=36), timedelta(minutes=10),
                     gpu_milli=250)
    JobUsage.objects.create(job_id=small.pk, peak_gpu_memory_mib=1024, util_sum=20.0, util_n=1,
                            first_seen_at=small.started_at, last_seen_at=small.finished_at)
    never_ran = JobFactory(tenant=vision, owner=alice, name="never", state=JobState.CANCELLED,
                           finished_at=django_timezone.now() - timedelta(days=3))
    old = finished(vision, alice, "old", JobState.TIMEOUT, timedelta(hours=1), timedelta(days=10))
    JobFactory(tenant=vision, owner=alice, name="waiting")  # not finished
    finished(vision, bob, "teammates", JobState.SUCCEEDED, timedelta(hours=1), timedelta(minutes=1))
    finished(charlie.memberships.get().tenant, charlie, "outsiders", JobState.SUCCEEDED, timedelta(hours=1),
             timedelta(minutes=1))

    code, out, err = run(capsys, "history")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    rows = {line.split()[1]: line for line in lines[1:-1]}
    assert list(rows) == ["small", "train", "never", "old"]  # newest finished first; only alice's finished
    assert "  2 h  " in rows["train"] and " 8.00 " in rows["train"]  # 4 GPUs x 2 h
    assert "25%" in rows["train"] and "20 GiB of 40 GiB (50%)" in rows["train"]
    # A quarter GPU busy 20% of the whole GPU used 80% of what it asked for.
    assert "  36 min  " in rows["small"] and " 0.15 " in rows["small"] and "80%" in rows["small"]
    assert rows["never"].split()[2:4] == ["CANCELLED", str((never_ran.finished_at).astimezone(timezone.utc).date())]
    assert " 0.00 " in rows["never"]
    assert lines[-1] == "4 jobs, 9.15 GPU-hours; GPU use 26% where measured."

    code, out, _ = run(capsys, "history", "--since", "2d", "--limit", "1")
    assert code == 0 and [line.split()[1] for line in out.splitlines()[1:-1]] == ["small"]
    code, out, _ = run(capsys, "--json", "history", "--since", "2d")
    assert [job["id"] for job in json.loads(out)] == [small.pk, train.pk]
    assert old.pk not in [job["id"] for job in json.loads(out)]
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    code, out, _ = run(capsys, "history", "--since", tomorrow)
    assert (code, out.strip()) == (0, f"No finished jobs since {tomorrow}.")


@pytest.mark.parametrize("argv, words", [
    (["history", "--since", "last tuesday"], "--since takes a duration back (7d, 12h) or a date"),
    (["history", "--limit", "0"], "--limit takes a positive number"),
])
def test_bad_history_flags_are_usage_errors(capsys, monkeypatch, argv, words):
    monkeypatch.setenv("COLONY_TOKEN", "t")
    monkeypatch.setenv("COLONY_URL", "http://127.0.0.1:9/")  # never reached
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err


def test_since_reads_durations_dates_and_times():
    now = datetime(2026, 2, 1, 12, 0, tzinfo=timezone.utc)
    assert since_time("7d", now) == datetime(2026, 1, 25, 12, 0, tzinfo=timezone.utc)
    assert since_time("2026-01-31", now) == datetime(2026, 1, 31, tzinfo=timezone.utc)
    assert since_time("2026-01-31T09:30+01:00", now) == datetime(2026, 1, 31, 8, 30, tzinfo=timezone.utc)
    with pytest.raises(Usage):
        since_time("7 fortnights", now)
