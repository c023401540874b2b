"""Roles that mean something: a researcher sees the tenant's jobs but cancels only their own; a
tenant lead cancels any of the tenant's jobs and limits what each member holds at once (API and
page), and the scheduling loop and the submission keep to those limits; outsiders see nothing."""

import pytest
from django.contrib.auth import get_user_model

from agents import protocol
from jobs.choices import JobState, Role
from jobs.models import Job, Membership
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, MembershipFactory, NodeFactory, UserFactory

JOB = {"command": ["python", "train.py"], "gpus": 1}


@pytest.fixture
def lena(vision):
    """A lead of vision."""
    return MembershipFactory(user=UserFactory(username="lena"), tenant=vision, role=Role.LEAD).user


@pytest.fixture
def alices_job(alice, vision):
    return JobFactory(owner=alice, tenant=vision, state=JobState.PENDING)


@pytest.fixture
def node2(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(2):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def cancel(api, user, job):
    return api(user).post(f"/api/v1/jobs/{job.pk}/cancel/", format="json")


def test_a_teammate_sees_but_cannot_cancel_and_is_told_who_can(api, bob, alices_job):
    assert api(bob).get(f"/api/v1/jobs/{alices_job.pk}/").status_code == 200
    response = cancel(api, bob, alices_job)
    assert response.status_code == 403
    assert "Only its owner (alice), a lead of tenant vision or an operator" in response.json()["error"]["message"]
    assert Job.objects.get(pk=alices_job.pk).state == JobState.PENDING


@pytest.mark.parametrize("who", ["alice", "lena", "operator"])
def test_the_owner_a_lead_and_an_operator_can_cancel(api, alice, lena, alices_job, who):
    user = {"alice": alice, "lena": lena,
            "operator": get_user_model().objects.create_user("ops", is_staff=True)}[who]
    assert cancel(api, user, alices_job).status_code == 200
    assert Job.objects.get(pk=alices_job.pk).state == JobState.CANCELLED


def test_the_page_offers_cancel_only_to_who_may_and_refuses_a_forged_post(client, bob, lena, alices_job):
    client.force_login(bob)
    page = client.get(f"/jobs/{alices_job.pk}/").content.decode()
    assert 'id="cancel-form" hidden' in page
    client.post(f"/jobs/{alices_job.pk}/cancel/")
    assert Job.objects.get(pk=alices_job.pk).state == JobState.PENDING
    client.force_login(lena)
    assert 'id="cancel-form" hidden' not in client.get(f"/jobs/{alices_job.pk}/").content.decode()


def test_members_api_shows_a_lead_every_member_and_a_researcher_only_themselves(api, alice, bob, lena, charlie,
                                                                                alices_job):
    url = "/api/v1/tenants/vision/members/"
    seen = {m["username"]: m for m in api(lena).get(url).json()}
    assert set(seen) == {"alice", "bob", "lena"} and seen["lena"]["role"] == "lead"
    assert [m["username"] for m in api(bob).get(url).json()] == ["bob"]
    assert api(charlie).get(url).status_code == 404
    assert api(charlie).get("/api/v1/tenants/nope/members/").status_code == 404


def test_only_a_lead_sets_limits_and_bad_ones_are_refused(api, alice, bob, lena):
    url = "/api/v1/tenants/vision/members/alice/"
    assert api(bob).patch(url, {"max_gpus": 1}, format="json").status_code == 403
    assert api(alice).patch(url, {"max_gpus": 99}, format="json").status_code == 403  # not even one's own
    assert api(lena).patch(url, {"max_gpus": -1}, format="json").status_code == 400
    response = api(lena).patch(url, {"max_gpus": 2, "max_running_jobs": 1}, format="json")
    assert response.status_code == 200 and response.json()["max_running_jobs"] == 1
    assert Membership.objects.filter(user=alice).values_list("max_gpus", "max_running_jobs").get() == (2, 1)


def test_a_job_bigger_than_the_members_gpu_limit_is_refused_at_submission(api, alice, lena, node2):
    Membership.objects.filter(user=alice).update(max_gpus=1)
    response = api(alice).post("/api/v1/jobs/", {**JOB, "gpus": 2}, format="json")
    assert response.status_code == 400
    assert "A lead of tenant vision lets you hold at most 1 GPU there at once" in \
        response.json()["error"]["fields"]["gpus"][0]


def test_the_loop_keeps_a_member_to_their_running_jobs_limit_and_says_so(api, alice, bob, lena, node2,
                                                                        django_capture_on_commit_callbacks):
    assert api(lena).patch("/api/v1/tenants/vision/members/alice/", {"max_running_jobs": 1},
                           format="json").status_code == 200
    ids = [api(user).post("/api/v1/jobs/", JOB, format="json").json()["id"] for user in (alice, alice, bob)]
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert [states[i] for i in ids] == [JobState.PLACED, JobState.PENDING, JobState.PLACED]
    reason = api(alice).get(f"/api/v1/jobs/{ids[1]}/").json()["pending_reason"]
    assert reason["code"] == "user_limit" and "alice has 1 job running in vision" in reason["message"]


def test_the_members_page_is_a_leads_and_saves_limits(client, alice, bob, lena):
    client.force_login(bob)
    assert client.get("/jobs/members/vision/").status_code == 404
    assert "/jobs/members/vision/" not in client.get("/jobs/").content.decode()  # no Members link
    client.force_login(lena)
    page = client.get("/jobs/").content.decode()
    assert 'href="/jobs/members/vision/"' in page
    assert 'data-member="alice"' in client.get("/jobs/members/vision/").content.decode()
    response = client.post("/jobs/members/vision/", {"member": "alice", "max_gpus": "3", "max_running_jobs": ""})
    assert response.status_code == 302
    assert Membership.objects.filter(user=alice).values_list("max_gpus", "max_running_jobs").get() == (3, None)
    client.post("/jobs/members/vision/", {"member": "alice", "max_gpus": "lots"})
    assert Membership.objects.get(user=alice).max_gpus == 3
