"""Server-rendered pages: the queue and the operator admin."""

import pytest

from jobs.choices import JobState
from tests.factories import GpuFactory, JobFactory, TenantFactory


def test_queue_requires_login(client):
    response = client.get("/jobs/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_login_page_renders(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b"Log in to Colony" in response.content


def test_queue_lists_own_tenants_jobs_with_state_and_reason(client, alice):
    vision = alice.memberships.get().tenant
    JobFactory(tenant=vision, owner=alice, name="resnet-sweep",
               pending_reason={"code": "waiting_for_free_gpus", "message": "Waiting for 2 free GPUs", "details": {}})
    JobFactory(tenant=TenantFactory(slug="nlp"), name="secret-llm")
    client.force_login(alice)
    page = client.get("/jobs/").content.decode()
    assert "resnet-sweep" in page
    assert "Waiting for 2 free GPUs" in page
    assert "secret-llm" not in page


def test_queue_shows_node_of_a_running_job(client, alice):
    from jobs.models import Allocation

    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice, state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=GpuFactory(node__name="gpu-node-7"))
    client.force_login(alice)
    assert "gpu-node-7" in client.get("/jobs/").content.decode()


@pytest.mark.parametrize("path", [
    "/admin/jobs/tenant/", "/admin/jobs/membership/", "/admin/jobs/job/", "/admin/jobs/allocation/",
    "/admin/monitoring/node/", "/admin/monitoring/gpu/", "/admin/jobs/tenant/add/",
])
def test_operator_admin_pages_load(admin_client, path):
    JobFactory()
    GpuFactory()
    assert admin_client.get(path).status_code == 200


def test_admin_shows_tenant_quotas(admin_client):
    TenantFactory(slug="vision", guaranteed_gpus=12, max_gpus=20)
    page = admin_client.get("/admin/jobs/tenant/").content.decode()
    assert "Guaranteed gpus" in page and "Max gpus" in page and "Weight" in page
    assert 'value="12"' in page and 'value="20"' in page


def test_researcher_cannot_open_the_admin(client, alice):
    client.force_login(alice)
    assert client.get("/admin/").status_code == 302
