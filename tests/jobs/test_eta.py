"""A pending job's ETA reaches the researcher: queue API, job API, queue page and job page."""

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, JobWait
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory


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


def test_how_far_off_past_etas_were_is_measured_and_shown(one_busy_gpu, vision, alice, charlie, api, client,
                                                          redis_client, django_capture_on_commit_callbacks):
    """The waiting job was promised ~500 s; its neighbour ends now instead, so it starts ~500 s
    early. The queue API and page say how far off ETAs were, over jobs the reader can see."""
    waiting = JobFactory(tenant=vision, owner=alice, gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    promised_at = JobWait.objects.get(job=waiting).first_eta_at
    assert promised_at is not None
    promised_in = promised_at - timezone.now().timestamp()
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()  # a later cycle's estimate does not replace the first promise
    Allocation.objects.filter(job=one_busy_gpu).update(released_at=timezone.now())
    type(one_busy_gpu).objects.filter(pk=one_busy_gpu.pk).update(state=JobState.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.PLACED
    assert waiting.eta_error_s == pytest.approx(-promised_in, abs=5)  # negative: it started early

    body = api(alice).get("/api/v1/eta-accuracy/").json()
    assert body["jobs"] == 1 and body["median_error_s"] < -400 and body["late_share"] == 0
    assert 400 < body["p90_abs_error_s"] < 600
    assert api(charlie).get("/api/v1/eta-accuracy/").json()["jobs"] == 0  # another tenant's jobs: none of theirs
    assert api(alice).get("/api/v1/eta-accuracy/", {"days": "x"}).status_code == 400
    client.force_login(alice)
    page = client.get("/jobs/").content.decode()
    assert "How ETAs held up over the last 7 days (1 job you can see)" in page and "(early)" in page
