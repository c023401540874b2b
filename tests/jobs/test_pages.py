"""Server-rendered pages: submit form (the API's rules and words), queue, job detail, cancel,
usage report and CSV, API tokens, overview/heatmap/nodes/docs shells."""

from datetime import timedelta

import time

import pytest
from django.utils import timezone

from cluster_ui.models import ApiToken
from jobs.choices import JobState
from jobs.models import Allocation, Job
from tests.factories import running_job
from tests.factories import JobFactory, MembershipFactory, TenantFactory

FORM = {"command": "python train.py --lr 3e-4", "gpus": "2", "gpu_milli": "1000", "run_as": "auto", "priority": "0"}


def form_errors(response) -> dict:
    return {name: list(errors) for name, errors in response.context["form"].errors.items()}


def test_submit_form_shares_the_per_user_submission_budget_with_the_api(alice, cluster, web, api, settings):
    from django.core.cache import cache

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"submit": "2/min"}}
    cache.clear()
    try:
        browser = web(alice)
        assert browser.post("/jobs/submit/", FORM).status_code == 302
        created = api(alice).post("/api/v1/jobs/", {"command": ["python", "x.py"], "gpus": 1}, format="json")
        assert created.status_code == 201
        refused = browser.post("/jobs/submit/", FORM)
        assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 60
        assert "faster than allowed" in refused.content.decode()
        assert Job.objects.filter(owner=alice).count() == 2
    finally:
        cache.clear()


def test_submit_form_creates_the_job_and_opens_it(alice, cluster, web):
    response = web(alice).post("/jobs/submit/", {**FORM, "name": "sweep", "gpu_memory": "20 GiB", "max_runtime": "4h",
                                                 "gpu_models": ["A100-80GB"], "run_as": "opportunistic",
                                                 "shareable": "on", "priority": "3", "profile_key": "resnet"})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.command == ["python", "train.py", "--lr", "3e-4"]
    assert (job.name, job.gpus, job.gpu_memory_mib, job.max_runtime_s) == ("sweep", 2, 20480, 14400)
    assert (job.gpu_models, job.opportunistic_only, job.shareable, job.priority) == (["A100-80GB"], True, True, 3)
    assert job.profile_key == "resnet" and job.tenant.slug == "vision" and job.owner == alice


def test_a_fraction_of_a_gpu(alice, cluster, web):
    web(alice).post("/jobs/submit/", {**FORM, "gpus": "1", "gpu_milli": "250"})
    assert Job.objects.get().gpu_milli == 250


@pytest.mark.parametrize("form, payload, form_field, api_field", [
    ({"gpus": "0"}, {"gpus": 0}, "gpus", "gpus"),
    ({"gpus": "99"}, {"gpus": 99}, "gpus", "gpus"),
    ({"gpus": "two"}, {"gpus": "two"}, "gpus", "gpus"),
    ({"gpus": ""}, {"gpus": None}, "gpus", "gpus"),
    ({"gpu_milli": "500"}, {"gpu_milli": 500}, "gpu_milli", "gpu_milli"),
    ({"gpu_memory": "100 GiB"}, {"gpu_memory_mib": 102400}, "gpu_memory", "gpu_memory_mib"),
    ({"gpu_models": ["K80"]}, {"gpu_models": ["K80"]}, "gpu_models", "gpu_models"),
    ({"priority": "11"}, {"priority": 11}, "priority", "priority"),
    ({"max_runtime": "31d"}, {"max_runtime_s": 31 * 86400}, "max_runtime", "max_runtime_s"),
    ({"max_nodes": "1", "gpus": "5"}, {"max_nodes": 1, "gpus": 5}, "gpus", "gpus"),
])
def test_form_refuses_with_the_apis_words(alice, cluster, web, api, form, payload, form_field, api_field):
    api_payload = {"command": ["python", "train.py", "--lr", "3e-4"], "gpus": 2, **payload}
    api_payload = {k: v for k, v in api_payload.items() if v is not None}
    api_errors = api(alice).post("/api/v1/jobs/", api_payload, format="json").json()["error"]["fields"]
    response = web(alice).post("/jobs/submit/", {**FORM, **form})
    assert response.status_code == 200
    assert form_errors(response)[form_field] == api_errors[api_field]
    assert not Job.objects.exists()


@pytest.mark.parametrize("form, field, words", [
    ({"command": "python 'unbalanced"}, "command", "Could not split the command"),
    ({"command": ""}, "command", "This field is required."),
    ({"gpu_memory": "lots"}, "gpu_memory", "Not a size: 'lots' (a number and a unit: 512MiB, 20GiB"),
    ({"max_runtime": "soon"}, "max_runtime", "Not a duration: 'soon' (try 90s, 45m, 4h"),
    # As on the command line: a bare number of minutes or seconds is a guess the form does not make.
    ({"max_runtime": "30"}, "max_runtime", "Give '30' a unit: 30s, 30m, 30h or 30d."),
    ({"preempt_grace": "90"}, "preempt_grace", "Give '90' a unit: 90s, 90m, 90h or 90d."),
])
def test_form_only_checks_of_its_own_are_about_parsing(alice, cluster, web, form, field, words):
    response = web(alice).post("/jobs/submit/", {**FORM, **form})
    assert words in " ".join(form_errors(response)[field])
    assert not Job.objects.exists()


def test_member_of_several_tenants_picks_one(alice, cluster, web):
    MembershipFactory(user=alice, tenant=TenantFactory(slug="speech"))
    page = web(alice).get("/jobs/submit/").content.decode()
    assert 'name="tenant"' in page and "speech" in page
    response = web(alice).post("/jobs/submit/", {**FORM, "tenant": ""})
    assert form_errors(response)["tenant"] == ["You belong to several tenants; say which one."]
    web(alice).post("/jobs/submit/", {**FORM, "tenant": "speech"})
    assert Job.objects.get().tenant.slug == "speech"


@pytest.mark.parametrize("form, fields", [
    ({"gpu_memory": "20GiB", "host_memory": "512 MiB"}, {"gpu_memory_mib": 20480, "host_memory_mib": 512}),
    ({"gpu_memory": "1.5G", "host_memory": "64 gb"}, {"gpu_memory_mib": 1536, "host_memory_mib": 65536}),
    ({"gpu_memory": "8"}, {"gpu_memory_mib": 8192}),  # a bare size is GiB, as colony submit --memory 8
    ({"max_runtime": "1h30m", "preempt_grace": "45s"}, {"max_runtime_s": 5400, "preempt_grace_s": 45}),
    ({"max_runtime": "2 h 05 min", "preempt_grace": "2m"}, {"max_runtime_s": 7500, "preempt_grace_s": 120}),
    ({"max_runtime": "1-00:00:00"}, {"max_runtime_s": 86400}),
])
def test_form_reads_sizes_and_durations_as_the_command_line_does(alice, cluster, web, form, fields):
    web(alice).post("/jobs/submit/", {**FORM, "gpus": "1", **form})
    job = Job.objects.get()
    assert {name: getattr(job, name) for name in fields} == fields


def test_queue_page_shows_position_reason_class_and_filters(alice, bob, vision, cluster, web):
    JobFactory(tenant=vision, owner=bob, name="older")
    waiting = JobFactory(tenant=vision, owner=alice, name="waiting-job", pending_reason={
        "code": "at_max_gpus", "message": "Tenant vision is using 8 of its 8-GPU ceiling", "details": {},
        "eta_at": time.time() + 720.4})
    Job.objects.filter(pk=waiting.pk).update(submitted_at=timezone.now() + timedelta(seconds=1))
    running_job(vision, alice, [cluster["a1/0"]], name="busy-job")
    page = web(alice).get("/jobs/").content.decode()
    assert "waiting-job" in page and "busy-job" in page
    assert "<strong>2</strong> of 2 in vision" in page
    # (stored in whole seconds: the second the page is drawn in may round either way)
    assert "Tenant vision is using 8 of its 8-GPU ceiling" in page
    assert "starts in ~12 min<" in page or "starts in ~11 min 59 s" in page
    assert "Guaranteed" in page
    mine = web(alice).get("/jobs/?owner=bob").content.decode()
    assert "older" in mine and "waiting-job" not in mine
    running = web(alice).get("/jobs/?state=running").content.decode()
    assert "busy-job" in running and "waiting-job" not in running


def test_queue_page_words_times_as_its_script_does(alice, vision, cluster, web):
    """The first render and the script's refresh (Colony.duration) print the same words, not
    Django's "2 hours, 5 minutes" then "2 h 05 min"."""
    busy = running_job(vision, alice, [cluster["a1/0"]], name="busy-job")
    Job.objects.filter(pk=busy.pk).update(started_at=timezone.now() - timedelta(seconds=7530))
    waiting = JobFactory(tenant=vision, owner=alice, name="waiting-job")
    Job.objects.filter(pk=waiting.pk).update(submitted_at=timezone.now() - timedelta(seconds=3 * 86400 + 4 * 3600 + 60))
    page = web(alice).get("/jobs/").content.decode()
    assert "running 2 h 05 min<" in page and "waiting 3 d 4 h<" in page


def test_job_page_shows_timeline_allocations_output_and_cancel(alice, vision, cluster, web):
    job = running_job(vision, alice, [cluster["a1/3"]], name="detail-job")
    Allocation.objects.filter(job=job).update(duty_cycle=0.5, memory_limit_mib=20480)
    page = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "0.50" in page and "throttled" in page  # a live GPU says how it is throttled
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(placed_at=now - timedelta(seconds=65), started_at=now - timedelta(seconds=60),
                                         state=JobState.SUCCEEDED, finished_at=now, exit_code=0,
                                         output_tail="epoch 3 loss 0.12\n")
    Allocation.objects.filter(job=job).update(released_at=now)
    page = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    for text in ("Submitted", "Placed on GPUs", "Started", "Finished", "+1 min<", "a1", "20 GiB",
                 "epoch 3 loss 0.12", "Succeeded"):
        assert text in page, text
    assert "throttled" not in page  # a released GPU has no duty cycle any more
    assert 'id="cancel-form" hidden' in page  # finished: nothing to cancel
    assert "/static/vendor/plotly.min.js" in page


def test_cancel_from_the_page(alice, vision, web):
    job = JobFactory(tenant=vision, owner=alice)
    response = web(alice).post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert f"Job #{job.pk} cancelled." in response.content.decode()
    again = web(alice).post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert "Not cancelled" in again.content.decode()
    assert web(alice).get(f"/jobs/{job.pk}/cancel/").status_code == 405


def test_usage_page_and_csv(alice, vision, cluster, web):
    job = running_job(vision, alice, [cluster["a1/0"]])
    Allocation.objects.filter(job=job).update(created_at=timezone.now() - timedelta(hours=2))
    page = web(alice).get("/jobs/usage/?days=7").content.decode()
    assert "GPU-hours by tenant" in page and "vision" in page
    csv = web(alice).get("/jobs/usage.csv?days=7")
    assert csv["Content-Type"].startswith("text/csv")
    lines = csv.content.decode().splitlines()
    assert lines[0] == "day,tenant,guaranteed_gpu_hours,opportunistic_gpu_hours,total_gpu_hours"
    assert len(lines) == 1 + 7
    assert sum(float(line.split(",")[4]) for line in lines[1:]) == pytest.approx(2.0, abs=0.01)


def test_api_token_page_creates_shows_once_and_revokes(alice, web):
    # (Expiry, names and revocation in depth: tests/cluster_ui/test_api_token_expiry.py.)
    client = web(alice)
    assert "No token yet" in client.get("/account/tokens/").content.decode()
    created = client.post("/account/tokens/", {"action": "create"}).content.decode()
    key = created.split('id="new-token">')[1].split("<")[0]
    assert ApiToken.objects.get(user=alice).ending == key[-4:]
    later = client.get("/account/tokens/").content.decode()
    assert key not in later and key[-4:] in later
    client.post("/account/tokens/", {"action": "revoke", "token": ApiToken.objects.get(user=alice).pk})
    assert not ApiToken.objects.get(user=alice).active


@pytest.mark.parametrize("path, text", [
    ("/", "Cluster overview"), ("/heatmap/", "Cluster heatmap"), ("/nodes/", "a1"), ("/nodes/v1/", "V100-32GB"),
    ("/api/docs/", "/api/v1/queue/"), ("/jobs/submit/", "Same job from a terminal"),
])
def test_pages_render(alice, cluster, web, path, text):
    response = web(alice).get(path)
    assert response.status_code == 200
    assert text in response.content.decode()


def test_no_asset_comes_from_a_cdn(alice, cluster, web):
    import re

    for path in ("/", "/heatmap/", "/jobs/", "/jobs/usage/", "/nodes/a1/", "/api/docs/"):
        page = web(alice).get(path).content.decode()
        # Every script, style sheet and image is a path on this server (a CSRF token may spell "cdn").
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page, flags=re.I)
        assert urls and not [u for u in urls if "//" in u or "cdn" in u.lower()], (path, urls)
        assert "https://" not in page, path


def test_unknown_node_is_404(alice, web, db):
    assert web(alice).get("/nodes/nope/").status_code == 404
