"""The job list filters ``colony history`` and ``colony cancel --name`` read through: a name
pattern, ``finished_after``, ``ordering``, and each entry's measured use (``mean_gpu_util``,
``peak_gpu_memory_mib``). They narrow what the user may see and never widen it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import JobState
from monitoring.models import JobUsage
from tests.factories import JobFactory


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [job["name"] for job in response.json()["results"]]


@pytest.mark.parametrize("pattern, expected", [
    ("sweep-*", ["sweep-1", "sweep-10", "sweep-2"]),
    ("sweep-?", ["sweep-1", "sweep-2"]),
    ("*-1*", ["sweep-1", "sweep-10"]),
    ("a.b", ["a.b"]),  # a dot is a dot, not any character
    ("sweep", []),  # the whole name, not a part of it
    ("(x", []),  # regular-expression characters are plain text
])
def test_a_name_pattern_matches_whole_names_shell_style(alice, vision, api, pattern, expected):
    for name in ("sweep-1", "sweep-2", "sweep-10", "a.b", "axb", "train"):
        JobFactory(tenant=vision, owner=alice, name=name)
    for path in ("/api/v1/queue/", "/api/v1/jobs/"):
        assert sorted(names(api(alice).get(path, {"name": pattern}))) == expected


def test_a_name_pattern_never_reaches_past_tenancy(alice, bob, charlie, vision, api):
    JobFactory(tenant=vision, owner=bob, name="sweep-teammate")
    JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie, name="sweep-outsider")
    assert names(api(alice).get("/api/v1/queue/", {"name": "sweep-*"})) == ["sweep-teammate"]
    assert names(api(alice).get("/api/v1/queue/", {"name": "sweep-*", "owner": "me"})) == []
    assert names(api(charlie).get("/api/v1/queue/", {"name": "*"})) == ["sweep-outsider"]


def test_finished_jobs_newest_finished_first_since_a_time_with_their_use(alice, vision, api):
    now = timezone.now()
    old = JobFactory(tenant=vision, owner=alice, name="old", state=JobState.SUCCEEDED,
                     started_at=now - timedelta(days=9), finished_at=now - timedelta(days=8))
    # submitted last, finished first: the order is by when they finished
    recent = JobFactory(tenant=vision, owner=alice, name="recent", state=JobState.FAILED,
                        started_at=now - timedelta(hours=3), finished_at=now - timedelta(hours=1),
                        peak_gpu_memory_mib=12288)
    latest = JobFactory(tenant=vision, owner=alice, name="latest", state=JobState.TIMEOUT,
                        started_at=now - timedelta(hours=2), finished_at=now - timedelta(minutes=5))
    JobFactory(tenant=vision, owner=alice, name="waiting")
    JobUsage.objects.create(job_id=recent.pk, peak_gpu_memory_mib=12288, util_sum=150.0, util_n=4,
                            first_seen_at=now, last_seen_at=now)
    JobUsage.objects.create(job_id=latest.pk, peak_gpu_memory_mib=0, util_sum=0, util_n=0,
                            first_seen_at=now, last_seen_at=now)

    query = {"state": "finished", "owner": "me", "ordering": "-finished_at"}
    assert names(api(alice).get("/api/v1/queue/", query)) == ["latest", "recent", "old"]
    since = (now - timedelta(days=1)).isoformat()
    response = api(alice).get("/api/v1/queue/", {**query, "finished_after": since})
    assert names(response) == ["latest", "recent"]
    by_name = {job["name"]: job for job in response.json()["results"]}
    assert (by_name["recent"]["mean_gpu_util"], by_name["recent"]["peak_gpu_memory_mib"]) == (37.5, 12288)
    assert by_name["latest"]["mean_gpu_util"] is None  # no sample: unknown, not 0
    assert old.pk not in [job["id"] for job in response.json()["results"]]
    # A time without a zone is UTC.
    naive = (now - timedelta(days=1)).replace(tzinfo=None).isoformat()
    assert names(api(alice).get("/api/v1/queue/", {**query, "finished_after": naive})) == ["latest", "recent"]


@pytest.mark.parametrize("params, field", [
    ({"finished_after": "yesterday"}, "finished_after"),
    ({"ordering": "name"}, "ordering"),
])
def test_an_unreadable_list_parameter_is_a_400_naming_it(alice, api, params, field):
    response = api(alice).get("/api/v1/queue/", params)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
