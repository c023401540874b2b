"""One error format everywhere, submission throttling with Retry-After, and a valid schema."""

from io import StringIO

import pytest
from django.core.management import call_command

from cluster_ui.api.errors import Conflict, error_body
from rest_framework import exceptions

GOOD = {"command": ["python", "train.py"], "gpus": 1}


@pytest.mark.parametrize("exc, code, message", [
    (exceptions.ValidationError({"gpus": ["Too many."]}), "invalid", "gpus: Too many."),
    (exceptions.ValidationError({"gpus": ["A"], "name": ["B"]}), "invalid", "Invalid input in gpus, name."),
    (exceptions.ValidationError({"non_field_errors": ["Both at once."]}), "invalid", "Both at once."),
    (exceptions.ValidationError({"command": {1: ["Not a valid string."]}}), "invalid", "command: Not a valid string."),
    (exceptions.NotFound(), "not_found", "Not found."),
    (Conflict("job 3 is succeeded and cannot be cancelled"), "conflict", "job 3 is succeeded and cannot be cancelled"),
])
def test_error_body(exc, code, message):
    from rest_framework.views import exception_handler

    body = error_body(exc, exception_handler(exc, {}).data)["error"]
    assert (body["code"], body["message"]) == (code, message)
    assert isinstance(body["fields"], dict)


def test_validation_errors_keep_field_names(alice, api):
    body = api(alice).post("/api/v1/jobs/", {"gpus": 0}, format="json").json()
    assert body["error"]["code"] == "invalid"
    assert set(body["error"]["fields"]) == {"command", "gpus"}


def test_malformed_json_is_a_parse_error(alice, api):
    response = api(alice).post("/api/v1/jobs/", "{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


def test_bad_token_is_refused_in_the_same_format(db, client):
    response = client.get("/api/v1/queue/", HTTP_AUTHORIZATION="Token not-a-token")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_submissions_are_throttled_per_user_with_retry_after(alice, bob, vision, api, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"submit": "2/min"}}
    from django.core.cache import cache

    cache.clear()
    try:
        client = api(alice)
        assert [client.post("/api/v1/jobs/", GOOD, format="json").status_code for _ in range(2)] == [201, 201]
        refused = client.post("/api/v1/jobs/", GOOD, format="json")
        assert refused.status_code == 429
        assert 0 < int(refused["Retry-After"]) <= 60
        assert refused.json()["error"]["code"] == "throttled"
        assert refused.json()["error"]["retry_after"] == int(refused["Retry-After"])
        # Reading is not throttled, and the limit is per user.
        assert client.get("/api/v1/jobs/").status_code == 200
        assert api(bob).post("/api/v1/jobs/", GOOD, format="json").status_code == 201
    finally:
        cache.clear()


def test_openapi_schema_validates_without_warnings(db):
    out = StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = out.getvalue()
    for path in ("/api/v1/queue/", "/api/v1/cluster/", "/api/v1/nodes/{name}/", "/api/v1/gpus/",
                 "/api/v1/metrics/heatmap/", "/api/v1/metrics/occupancy/", "/api/v1/jobs/{id}/metrics/",
                 "/api/v1/tenants/{slug}/", "/api/v1/usage/"):
        assert f"{path}:" in schema, path


def test_another_tenants_job_reads_as_no_such_job(alice, api):
    """Not Django's "No Job matches the given query.", and the same words whether the job is
    someone else's or was never there."""
    from tests.factories import JobFactory, TenantFactory

    theirs = JobFactory(tenant=TenantFactory(slug="other"))
    for job_id in (theirs.pk, theirs.pk + 1000):
        body = api(alice).get(f"/api/v1/jobs/{job_id}/").json()["error"]
        assert (body["code"], body["message"]) == ("not_found", "No such job, or not one you can see.")
