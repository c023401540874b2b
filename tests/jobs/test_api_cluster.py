"""/api/v1/cluster/ (overview), /api/v1/tenants/ and /api/v1/usage/: cluster-wide totals."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import RunClass, JobState
from jobs.models import Allocation, Job, Tenant
from monitoring.choices import NodeHealth
from monitoring.models import Node
from tests.factories import JobFactory, TenantFactory, at, running_job


@pytest.fixture
def vision(db):
    """Guarantee 4 GPUs, ceiling 8: the figures below are read against these."""
    return TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=8)


def test_gpu_counts_busy_shared_idle_lost(cluster, alice, charlie, vision, nlp, api):
    running_job(vision, alice, [cluster["a1/0"], cluster["a1/1"]])
    running_job(vision, alice, [cluster["a1/2"]], milli=500, run_class=RunClass.OPPORTUNISTIC)
    running_job(nlp, charlie, [cluster["a1/2"]], milli=500, run_class=RunClass.OPPORTUNISTIC)
    Node.objects.filter(name="v1").update(state=NodeHealth.LOST)
    gpus = api(charlie).get("/api/v1/cluster/").json()["gpus"]
    assert gpus == {"total": 6, "busy": 3, "shared": 1, "idle": 1, "lost": 2, "cordoned_idle": 0,
                    "mig_instances": 0, "mig_instances_busy": 0}


def test_tenants_against_quota_are_visible_to_everyone(cluster, alice, charlie, vision, nlp, api):
    running_job(vision, alice, [cluster["a1/0"], cluster["a1/1"]])
    running_job(vision, alice, [cluster["a1/2"]], milli=250, run_class=RunClass.OPPORTUNISTIC)
    JobFactory(tenant=vision, owner=alice)
    tenants = {t["slug"]: t for t in api(charlie).get("/api/v1/tenants/").json()}
    assert tenants["vision"]["guaranteed_gpus"] == 4 and tenants["vision"]["max_gpus"] == 8
    assert tenants["vision"]["usage"] == {"guaranteed_gpus_used": 2.0, "opportunistic_gpus_used": 0.25,
                                          "gpus_used": 2.25, "running_jobs": 2, "pending_jobs": 1}
    assert (tenants["vision"]["member"], tenants["nlp"]["member"]) == (False, True)
    assert api(charlie).get("/api/v1/tenants/vision/").json()["usage"]["gpus_used"] == 2.25


def test_a_tenants_idle_gpu_policy_is_public(vision, alice, api):
    assert api(alice).get("/api/v1/tenants/vision/").json()["idle_policy"] == {
        "notify_minutes": None, "opportunistic_minutes": None, "suspend_minutes": None, "requeue_minutes": None,
        "util_percent": None}
    Tenant.objects.filter(pk=vision.pk).update(idle_notify_minutes=15, idle_requeue_minutes=60, idle_util_percent=3)
    policy = api(alice).get("/api/v1/tenants/vision/").json()["idle_policy"]
    assert (policy["notify_minutes"], policy["requeue_minutes"], policy["util_percent"]) == (15, 60, 3)


def test_tenants_are_read_only_and_unknown_ones_404(alice, api):
    client = api(alice)
    assert client.get("/api/v1/tenants/nope/").json()["error"]["code"] == "not_found"
    response = client.put("/api/v1/tenants/vision/", {"guaranteed_gpus": 100}, format="json")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert client.post("/api/v1/tenants/", {"slug": "x"}, format="json").status_code == 405


def test_queue_length_and_median_wait(alice, vision, api):
    now = timezone.now()
    for wait in (10, 20, 90):
        job = JobFactory(tenant=vision, owner=alice, state=JobState.SUCCEEDED)
        Job.objects.filter(pk=job.pk).update(submitted_at=now - timedelta(seconds=wait + 5),
                                             placed_at=now - timedelta(seconds=5))
    JobFactory(tenant=vision, owner=alice)
    queue = api(alice).get("/api/v1/cluster/").json()["queue"]
    assert queue["pending"] == 1
    assert queue["median_wait_s"] == 20.0
    assert queue["oldest_pending_s"] >= 0


def test_usage_report_splits_classes_days_and_fractions(cluster, alice, charlie, vision, nlp, api, settings):
    day1 = timezone.now().date() - timedelta(days=2)  # day 2 is yesterday: wholly past
    evening = at(f"{day1.isoformat()}T23:00:00")
    guaranteed = running_job(vision, alice, [cluster["a1/0"], cluster["a1/1"]])
    borrowed = running_job(nlp, charlie, [cluster["a1/2"]], milli=500, run_class=RunClass.OPPORTUNISTIC)
    # 2 GPUs from 23:00 to 01:00 (1 h each side of midnight); half a GPU from 22:00 to 01:00.
    Allocation.objects.filter(job=guaranteed).update(created_at=evening, released_at=evening + timedelta(hours=2))
    Allocation.objects.filter(job=borrowed).update(created_at=evening - timedelta(hours=1),
                                                   released_at=evening + timedelta(hours=2))
    rows = api(alice).get("/api/v1/usage/", {"days": 3}).json()["rows"]
    table = {(r["day"], r["tenant"]): r for r in rows}
    assert len(rows) == 6  # 3 days x 2 tenants, zero days included
    day2 = (day1 + timedelta(days=1)).isoformat()
    assert table[(day1.isoformat(), "vision")]["guaranteed_gpu_hours"] == 2.0
    assert table[(day2, "vision")]["guaranteed_gpu_hours"] == 2.0
    assert table[(day1.isoformat(), "nlp")]["opportunistic_gpu_hours"] == 1.0
    assert table[(day2, "nlp")]["opportunistic_gpu_hours"] == 0.5
    assert table[(day2, "nlp")]["total_gpu_hours"] == 0.5
    assert api(alice).get("/api/v1/usage/", {"days": 3, "tenant": "nlp"}).json()["rows"][0]["tenant"] == "nlp"


def test_usage_report_rejects_bad_days(alice, api):
    response = api(alice).get("/api/v1/usage/", {"days": 0})
    assert response.status_code == 400
    assert "days" in response.json()["error"]["fields"]
