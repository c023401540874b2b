"""POST /api/v1/jobs/bulk/: many jobs in one request, each checked as a single submission is, all or
none; counted against the submission rate as one submission per request; tenancy as for one job."""

import json

import pytest
from django.core.cache import cache

from jobs.choices import JobEventKind, JobState
from jobs.models import Job, JobDependency, JobEvent
from tests.factories import JobFactory, TenantFactory

URL = "/api/v1/jobs/bulk/"
JOB = {"command": ["python", "train.py"], "gpus": 1}


def errors_of(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["error"]["fields"]


@pytest.fixture
def submit_rate(settings):
    """Set the per-user submission rate for one test."""
    def set_rate(rate: str | None):
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"submit": rate}}
        cache.clear()
    return set_rate


def test_many_jobs_are_submitted_in_order_with_their_events(api, alice, vision):
    specs = [{**JOB, "name": f"sweep-{i}", "env": {"LR": str(i)}, "priority": i % 3} for i in range(50)]
    response = api(alice).post(URL, {"jobs": specs}, format="json")
    assert response.status_code == 201, response.content
    ids = response.json()["jobs"]
    assert len(ids) == 50
    jobs = Job.objects.in_bulk(ids)
    assert [jobs[i].name for i in ids] == [f"sweep-{i}" for i in range(50)]
    assert [jobs[i].env for i in ids] == [{"LR": str(i)} for i in range(50)]
    assert all(job.state == JobState.PENDING and job.owner == alice and job.tenant == vision for job in jobs.values())
    events = list(JobEvent.objects.filter(job_id__in=ids))
    assert len(events) == 50 and {e.kind for e in events} == {JobEventKind.SUBMITTED}
    assert {e.message for e in events} == {"By alice to vision."}


def test_a_bulk_job_reads_as_the_same_job_submitted_alone(api, alice):
    spec = {**JOB, "name": "same", "gpus": 2, "gpu_memory_mib": 1024, "max_runtime_s": 60, "checkpoints": True}
    one = api(alice).post("/api/v1/jobs/", spec, format="json").json()
    [bulk_id] = api(alice).post(URL, {"jobs": [spec]}, format="json").json()["jobs"]
    many = api(alice).get(f"/api/v1/jobs/{bulk_id}/").json()
    differ = {"id", "submitted_at", "events"}
    assert {k: v for k, v in many.items() if k not in differ} == {k: v for k, v in one.items() if k not in differ}
    assert [(e["kind"], e["message"]) for e in many["events"]] == [(e["kind"], e["message"]) for e in one["events"]]


def test_dependencies_are_recorded_per_job(api, alice, vision):
    first = JobFactory(tenant=vision, owner=alice)
    response = api(alice).post(URL, {"jobs": [{**JOB, "after_ok": [first.pk]}, {**JOB, "after_any": [first.pk]}, JOB]},
                               format="json")
    a, b, c = response.json()["jobs"]
    assert set(JobDependency.objects.values_list("job_id", "on_id", "kind")) == {
        (a, first.pk, JobDependency.Kind.OK), (b, first.pk, JobDependency.Kind.ANY)}
    assert api(alice).get(f"/api/v1/jobs/{c}/").json()["dependencies"] == []


def test_invalid_jobs_are_named_by_index_and_nothing_is_submitted(api, alice):
    specs = [JOB, {**JOB, "gpus": 0}, JOB, {"command": []}, {**JOB, "gpu": 1}]
    fields = errors_of(api(alice).post(URL, {"jobs": specs}, format="json"))
    assert set(fields) == {"jobs"}
    assert set(fields["jobs"]) == {"1", "3", "4"}
    assert "gpus" in fields["jobs"]["1"]
    assert set(fields["jobs"]["3"]) == {"command", "gpus"}
    assert fields["jobs"]["4"] == {"gpu": ["Unknown field."]}
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_job_the_inventory_could_never_run_refuses_the_whole_request(api, alice, inventory):
    fields = errors_of(api(alice).post(URL, {"jobs": [JOB, {**JOB, "gpus": 9}]}, format="json"))
    assert fields["jobs"]["1"]["gpus"] == [
        "The cluster has 8 GPUs of one model (a gang runs on one GPU model); 9 can never be granted."]
    assert not Job.objects.exists()


def test_arrays_are_refused_in_bulk(api, alice):
    fields = errors_of(api(alice).post(URL, {"jobs": [{**JOB, "array": "0-3"}]}, format="json"))
    assert fields["jobs"]["0"] == {"array": ["Submit arrays with POST /api/v1/jobs/."]}


@pytest.mark.parametrize("body, message", [
    ({"jobs": []}, "Give at least one job."),
    ({"jobs": [JOB] * 1001}, "At most 1000 jobs per request; send the rest in another."),
    ({"jobs": JOB}, None),
    ({"jobs": ["python"]}, None),
    ({}, None),
    ({"jobs": [JOB], "tenant": "vision"}, None),
])
def test_a_malformed_envelope_is_refused(api, alice, body, message):
    fields = errors_of(api(alice).post(URL, body, format="json"))
    if message:
        assert fields["jobs"] == [message]
    assert not Job.objects.exists()


def test_a_body_over_the_api_limit_is_413(api, alice, settings):
    big = {"jobs": [{**JOB, "env": {"PAD": "x" * 4000}}] * 70}  # ~280 KiB
    assert len(json.dumps(big)) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    response = api(alice).post(URL, big, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert not Job.objects.exists()


def test_the_promised_thousand_jobs_go_through_on_the_default_rate(api, alice, settings):
    assert settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["submit"] == "120/min"  # COLONY_SUBMIT_RATE unset
    client = api(alice)
    response = client.post(URL, {"jobs": [JOB] * 1000}, format="json")
    assert response.status_code == 201, response.content
    assert len(response.json()["jobs"]) == 1000 == Job.objects.count()
    # It took one submission of the 120: the next request goes through too.
    assert client.post("/api/v1/jobs/", JOB, format="json").status_code == 201


def test_a_bulk_request_counts_as_one_submission_and_the_refusal_names_the_rate(api, alice, bob, submit_rate):
    submit_rate("3/min")
    client = api(alice)
    assert client.post(URL, {"jobs": [JOB] * 8}, format="json").status_code == 201
    assert client.post("/api/v1/jobs/", JOB, format="json").status_code == 201
    assert client.post(URL, {"jobs": [JOB] * 8}, format="json").status_code == 201
    refused = client.post(URL, {"jobs": [JOB] * 2}, format="json")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "throttled"
    assert "at most 3 submissions a minute (COLONY_SUBMIT_RATE=3/min)" in error["message"]
    assert "a bulk request or a code upload counts as one" in error["message"]
    assert 0 < int(refused["Retry-After"]) <= 60
    assert Job.objects.count() == 17
    assert client.post("/api/v1/jobs/", JOB, format="json").status_code == 429
    # The rate is per user.
    assert api(bob).post(URL, {"jobs": [JOB] * 10}, format="json").status_code == 201


def test_invalid_bulk_still_counts_against_the_rate_as_single_submissions_do(api, alice, submit_rate):
    submit_rate("2/min")
    assert api(alice).post(URL, {"jobs": [{**JOB, "gpus": 0}] * 3}, format="json").status_code == 400
    assert api(alice).post(URL, {"jobs": [JOB] * 2}, format="json").status_code == 201
    assert api(alice).post(URL, {"jobs": [JOB] * 2}, format="json").status_code == 429


def test_each_job_goes_to_a_tenant_of_the_submitter(api, alice, charlie, vision):
    TenantFactory(slug="robotics")  # exists, alice is not a member
    specs = [{**JOB, "tenant": "vision"}, {**JOB, "tenant": "nlp"}, {**JOB, "tenant": "robotics"},
             {**JOB, "tenant": "nowhere"}]
    fields = errors_of(api(alice).post(URL, {"jobs": specs}, format="json"))
    assert set(fields["jobs"]) == {"1", "2", "3"}
    # The same answer for someone else's tenant as for none at all.
    assert fields["jobs"]["1"]["tenant"] == ["Unknown tenant 'nlp', or you are not a member of it."]
    assert fields["jobs"]["3"]["tenant"] == ["Unknown tenant 'nowhere', or you are not a member of it."]
    assert not Job.objects.exists()


def test_jobs_may_go_to_several_of_the_submitters_tenants(api, alice, vision, charlie):
    from tests.factories import MembershipFactory

    nlp = charlie.memberships.get().tenant
    MembershipFactory(user=alice, tenant=nlp)
    ids = api(alice).post(URL, {"jobs": [{**JOB, "tenant": "vision"}, {**JOB, "tenant": "nlp"}]},
                          format="json").json()["jobs"]
    assert [Job.objects.get(pk=i).tenant.slug for i in ids] == ["vision", "nlp"]
    assert set(JobEvent.objects.values_list("message", flat=True)) == {"By alice to vision.", "By alice to nlp."}
    # Without a tenant, a member of several must say which.
    fields = errors_of(api(alice).post(URL, {"jobs": [JOB]}, format="json"))
    assert fields["jobs"]["0"]["tenant"] == ["You belong to several tenants; say which one."]


def test_dependencies_on_another_tenants_jobs_are_refused(api, alice, charlie):
    theirs = JobFactory(owner=charlie, tenant=charlie.memberships.get().tenant)
    fields = errors_of(api(alice).post(URL, {"jobs": [{**JOB, "after_ok": [theirs.pk]}]}, format="json"))
    assert "after_ok" in fields["jobs"]["0"]


def test_outsiders_and_anonymous_users_submit_nothing(api, db):
    assert api().post(URL, {"jobs": [JOB]}, format="json").status_code in (401, 403)
    from tests.factories import UserFactory

    fields = errors_of(api(UserFactory(username="nomad")).post(URL, {"jobs": [JOB]}, format="json"))
    assert fields["jobs"]["0"]["tenant"] == ["You are not a member of any tenant."]
    assert not Job.objects.exists()
