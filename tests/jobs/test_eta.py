"""A pending job's ETA reaches the researcher: queue API, job API, queue page and job page."""

import time

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.cycle import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, MembershipFactory, NodeFactory, UserFactory


@pytest.fixture
def one_busy_gpu(vision, redis_client, live_redis):
    """One GPU, held by a job 100 s into its 600 s runtime limit."""
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    running = JobFactory(tenant=vision, state=JobState.RUNNING, max_runtime_s=600, run_class="guaranteed",
                         started_at=timezone.now() - timezone.timedelta(seconds=100))
    Allocation.objects.create(job=running, gpu=gpu)
    return running


def test_a_job_waiting_for_a_busy_gpu_shows_when_it_should_start(one_busy_gpu, vision, alice, api, client,
                                                                 django_capture_on_commit_callbacks):
    waiting = JobFactory(tenant=vision, owner=alice, gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.PENDING

    (entry,) = [j for j in api(alice).get("/api/v1/queue/", {"state": "pending"}).json()["results"]
                if j["id"] == waiting.pk]
    assert 440 <= entry["eta_s"] <= 530  # ~500 s left of the running job's limit (stored to 30 s)
    assert 440 <= api(alice).get(f"/api/v1/jobs/{waiting.pk}/").json()["eta_s"] <= 530
    client.force_login(alice)
    assert "starts in ~" in client.get("/jobs/").content.decode()
    assert "Likely to start in about" in client.get(f"/jobs/{waiting.pk}/").content.decode()


def test_a_job_with_no_estimate_says_nothing_about_when(vision, alice, api):
    job = JobFactory(tenant=vision, owner=alice, pending_reason={"code": "no_capacity", "message": "m", "details": {}})
    assert api(alice).get(f"/api/v1/jobs/{job.pk}/").json()["eta_s"] is None
