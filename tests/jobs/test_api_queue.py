"""/api/v1/queue/: position in the tenant's queue, class, pending reason, ETA, filters."""

from datetime import timedelta

import time

import pytest

from jobs.choices import RunClass, JobState
from jobs.models import Job
from tests.factories import running_job
from tests.factories import JobFactory, UserFactory

URL = "/api/v1/queue/"


def by_id(response):
    return {job["id"]: job for job in response.json()["results"]}


def test_pending_jobs_carry_their_place_in_the_tenant_queue(alice, bob, vision, api):
    first = JobFactory(tenant=vision, owner=alice)
    second = JobFactory(tenant=vision, owner=bob)
    urgent = JobFactory(tenant=vision, owner=bob, priority=5)
    # Submit times decide within a priority: make them distinct and ordered.
    for n, job in enumerate((first, second, urgent)):
        Job.objects.filter(pk=job.pk).update(submitted_at=job.submitted_at + timedelta(seconds=n))
    jobs = by_id(api(alice).get(URL))
    assert (jobs[urgent.pk]["queue_position"], jobs[urgent.pk]["queue_length"]) == (1, 3)
    assert jobs[first.pk]["queue_position"] == 2
    assert jobs[second.pk]["queue_position"] == 3


def test_running_job_shows_class_and_nodes_and_no_position(cluster, alice, vision, api):
    job = running_job(vision, alice, [cluster["a1/0"], cluster["v1/1"]], run_class=RunClass.OPPORTUNISTIC)
    entry = by_id(api(alice).get(URL))[job.pk]
    assert entry["run_class"] == "opportunistic"
    assert entry["nodes"] == ["a1", "v1"]
    assert entry["queue_position"] is None


@pytest.mark.parametrize("eta_in, eta", [(600.4, 600.0), (-30, 0.0), (None, None)])
def test_pending_reason_and_eta(alice, vision, api, eta_in, eta):
    """The cycle stores an ETA as an absolute time (``eta_at``); the API says what is left of it."""
    reason = {"code": "waiting_for_free_gpus", "message": "Waiting for 2 GPUs", "details": {}}
    if eta_in is not None:
        reason["eta_at"] = time.time() + eta_in
    job = JobFactory(tenant=vision, owner=alice, pending_reason=reason)
    entry = by_id(api(alice).get(URL))[job.pk]
    assert entry["pending_reason"]["message"] == reason["message"]
    assert entry["eta_s"] == (None if eta is None else pytest.approx(eta, abs=1))  # stored in whole seconds


def test_filters_by_state_tenant_and_owner(alice, bob, vision, api):
    mine = JobFactory(tenant=vision, owner=alice)
    done = JobFactory(tenant=vision, owner=alice, state=JobState.SUCCEEDED)
    teammates = JobFactory(tenant=vision, owner=bob)
    client = api(alice)
    assert set(by_id(client.get(URL, {"owner": "me"}))) == {mine.pk, done.pk}
    assert set(by_id(client.get(URL, {"owner": "bob"}))) == {teammates.pk}
    assert set(by_id(client.get(URL, {"state": "active"}))) == {mine.pk, teammates.pk}
    assert set(by_id(client.get(URL, {"state": "finished"}))) == {done.pk}
    assert (set(by_id(client.get(URL, {"state": "succeeded,pending", "tenant": "vision"})))
            == {mine.pk, done.pk, teammates.pk})


def test_unknown_state_is_a_validation_error(alice, api):
    response = api(alice).get(URL, {"state": "sleeping"})
    assert response.status_code == 400
    assert "Unknown state(s) sleeping" in response.json()["error"]["fields"]["state"][0]


def test_a_user_in_no_tenant_sees_an_empty_queue(vision, alice, api):
    JobFactory(tenant=vision, owner=alice)
    assert api(UserFactory(username="nobody")).get(URL).json()["count"] == 0
