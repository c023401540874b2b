"""Tenancy on every job-scoped endpoint and page: the owner and her teammate see and act on the
job; an outsider gets 404 (not 403: the job's existence is not revealed); staff see everything."""

import pytest

from jobs.choices import JobState
from jobs.models import Job
from monitoring.choices import AlertKind
from monitoring.models import Alert
from tests.factories import running_job
from tests.factories import JobFactory

READS = [
    ("api", "/api/v1/jobs/{id}/"),
    ("api", "/api/v1/jobs/{id}/metrics/"),
    ("web", "/jobs/{id}/"),
]
WRITES = [
    ("api", "/api/v1/jobs/{id}/cancel/"),
    ("web", "/jobs/{id}/cancel/"),
]


@pytest.fixture
def job(alice, vision):
    return JobFactory(tenant=vision, owner=alice, name="resnet-private")


def fetch(kind, path, user, api, client, method="get"):
    if kind == "api":
        return getattr(api(user), method)(path)
    client.force_login(user)
    return getattr(client, method)(path)


@pytest.mark.parametrize("kind, path", READS)
def test_owner_and_teammate_read_outsider_gets_404(kind, path, job, alice, bob, charlie, api, client):
    url = path.format(id=job.pk)
    assert fetch(kind, url, alice, api, client).status_code == 200
    assert fetch(kind, url, bob, api, client).status_code == 200
    response = fetch(kind, url, charlie, api, client)
    assert response.status_code == 404
    assert b"resnet-private" not in response.content


@pytest.mark.parametrize("kind, path", WRITES)
def test_outsider_cannot_cancel_nor_a_teammate_and_the_owner_can(kind, path, job, alice, bob, charlie, api, client):
    url = path.format(id=job.pk)
    assert fetch(kind, url, charlie, api, client, "post").status_code == 404
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert fetch(kind, url, bob, api, client, "post").status_code in (403, 302)  # sees it, may not cancel it
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert fetch(kind, url, alice, api, client, "post").status_code in (200, 302)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_api_404_uses_the_error_format(job, charlie, api):
    body = api(charlie).get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    assert body["error"]["code"] == "not_found"


def test_lists_and_queue_hide_other_tenants_jobs(job, charlie, nlp, api, web):
    theirs = JobFactory(tenant=nlp, owner=charlie, name="charlies-job")
    ids = [j["id"] for j in api(charlie).get("/api/v1/queue/").json()["results"]]
    assert ids == [theirs.pk]
    assert api(charlie).get("/api/v1/queue/", {"tenant": "vision"}).json()["results"] == []
    page = web(charlie).get("/jobs/?tenant=vision").content.decode()
    assert "resnet-private" not in page


def test_staff_see_every_tenant(job, charlie, nlp, operator, api):
    JobFactory(tenant=nlp, owner=charlie)
    assert api(operator).get("/api/v1/queue/").json()["count"] == 2
    assert api(operator).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 200


def test_occupancy_names_only_visible_jobs(cluster, alice, charlie, vision, api):
    job = running_job(vision, alice, [cluster["a1/0"]], name="secret-sweep")
    gpu = str(cluster["a1/0"].pk)
    mine = api(alice).get("/api/v1/metrics/occupancy/", {"range": "1h"}).json()["gpus"][gpu][0]
    assert (mine["job"], mine["name"], mine["tenant"]) == (job.pk, "secret-sweep", "vision")
    theirs = api(charlie).get("/api/v1/metrics/occupancy/", {"range": "1h"}).json()["gpus"][gpu][0]
    assert (theirs["job"], theirs["name"], theirs["tenant"]) == (None, None, None)
    assert theirs["label"] == "another tenant's job"
    assert "secret-sweep" not in str(theirs)


def test_node_page_names_only_visible_jobs(cluster, alice, charlie, vision, web):
    running_job(vision, alice, [cluster["a1/1"]], name="secret-sweep")
    assert "secret-sweep" in web(alice).get("/nodes/a1/").content.decode()
    page = web(charlie).get("/nodes/a1/").content.decode()
    assert "secret-sweep" not in page
    assert "another tenant&#x27;s job" in page or "another tenant's job" in page


def test_alerts_about_other_tenants_jobs_are_anonymised(cluster, alice, charlie, vision, api):
    job = running_job(vision, alice, [cluster["a1/2"]])
    gpu = cluster["a1/2"]
    Alert.objects.create(kind=AlertKind.MEMORY_OVER_REQUEST, node=gpu.node, gpu=gpu, job_id=job.pk,
                         message=f"Job {job.pk} uses 70000 MiB per GPU, more than the 20000 MiB it asked for",
                         opened_at=job.submitted_at, last_seen_at=job.submitted_at)
    mine = api(alice).get("/api/v1/cluster/").json()["alerts"][0]
    assert mine["job_id"] == job.pk and "70000" in mine["message"]
    theirs = api(charlie).get("/api/v1/cluster/").json()["alerts"][0]
    assert theirs["job_id"] is None
    assert "70000" not in theirs["message"] and "another tenant's job" in theirs["message"]
    assert theirs["node"] == "a1"  # where it is stays visible: that is cluster-wide


@pytest.mark.parametrize("path", ["/", "/jobs/", "/jobs/submit/", "/heatmap/", "/nodes/", "/nodes/a1/",
                                  "/jobs/usage/", "/jobs/usage.csv", "/account/tokens/", "/api/docs/"])
def test_pages_need_login(client, cluster, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("path", ["/api/v1/queue/", "/api/v1/cluster/", "/api/v1/nodes/", "/api/v1/gpus/",
                                  "/api/v1/tenants/", "/api/v1/usage/", "/api/v1/metrics/heatmap/",
                                  "/api/v1/metrics/occupancy/"])
def test_api_needs_authentication(api, db, path):
    response = api().get(path)
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] in ("not_authenticated", "authentication_failed")
