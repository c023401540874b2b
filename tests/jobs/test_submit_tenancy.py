"""Submitting (``POST /api/v1/jobs/`` and ``/bulk/``) reads no job through the view's queryset, so
the view does not narrow it for the requester: it leaves it empty. Authentication, permissions and
the submission rate still apply, and dependencies are still looked up only among jobs the
submitter may see."""

import pytest

from jobs.api.views import JobViewSet
from tests.factories import JobFactory

URL = "/api/v1/jobs/"
JOB = {"command": ["python", "train.py"], "gpus": 1}


@pytest.fixture
def querysets(monkeypatch):
    """The view's queryset once each request's checks ran, by action."""
    seen = {}
    initial = JobViewSet.initial

    def spy(self, request, *args, **kwargs):
        initial(self, request, *args, **kwargs)
        seen[self.action] = self.queryset

    monkeypatch.setattr(JobViewSet, "initial", spy)
    return seen


def test_a_submitting_view_holds_no_jobs(api, alice, inventory, querysets):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    assert api(alice).post(URL, JOB, format="json").status_code == 201
    assert api(alice).post(f"{URL}bulk/", {"jobs": [JOB]}, format="json").status_code == 201
    assert api(alice).get(f"{URL}{job.pk}/").status_code == 200
    assert set(querysets) == {"create", "bulk", "retrieve"}
    assert querysets["create"].query.is_empty() and not querysets["create"].exists()
    assert querysets["bulk"].query.is_empty() and not querysets["bulk"].exists()
    assert job in querysets["retrieve"]


def test_other_actions_still_see_the_requesters_jobs(api, alice, charlie, inventory):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    assert api(alice).get(f"{URL}{job.pk}/").status_code == 200
    assert api(charlie).get(f"{URL}{job.pk}/").status_code == 404
    assert [found["id"] for found in api(charlie).get(URL).json()["results"]] == []


def test_an_anonymous_submission_is_refused(api, inventory):
    for url, body in ((URL, JOB), (f"{URL}bulk/", {"jobs": [JOB]})):
        assert api().post(url, body, format="json").status_code in (401, 403)


def test_the_submission_rate_still_applies(api, alice, inventory, settings):
    from rest_framework.settings import api_settings

    rates = api_settings.DEFAULT_THROTTLE_RATES
    old = rates.get("submit")
    rates["submit"] = "2/min"
    try:
        client = api(alice)
        assert [client.post(URL, JOB, format="json").status_code for _ in range(3)] == [201, 201, 429]
    finally:
        rates["submit"] = old


def test_a_dependency_on_an_outsiders_job_is_still_refused(api, alice, charlie, inventory):
    theirs = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)
    refused = api(alice).post(URL, {**JOB, "after_ok": [theirs.pk]}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["after_ok"] == [
        f"No job {theirs.pk} in tenant vision, or not one you can see."]
