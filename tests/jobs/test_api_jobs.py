"""REST API v1 /jobs: submission, validation, listing, cancel, and tenancy."""

import pytest

from cluster_ui.models import ApiToken
from jobs.choices import JobState
from jobs.models import Job
from tests.factories import JobFactory, MembershipFactory, TenantFactory

URL = "/api/v1/jobs/"
GOOD = {"name": "train", "command": ["python", "train.py", "--epochs", "3"], "gpus": 2}


def test_submission_creates_a_pending_job_for_the_users_tenant(api, alice, inventory):
    response = api(alice).post(URL, GOOD, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "PENDING"
    assert body["tenant"] == "vision"
    assert body["owner"] == "alice"
    assert body["command"] == GOOD["command"]
    assert Job.objects.get(pk=body["id"]).gpus == 2


def test_name_defaults_to_the_program(api, alice, inventory):
    response = api(alice).post(URL, {"command": ["/usr/bin/python3", "-V"], "gpus": 1}, format="json")
    assert response.json()["name"] == "python3"


@pytest.mark.parametrize(
    "payload, field, words",
    [
        ({**GOOD, "gpus": 0}, "gpus", "greater than or equal to 1"),
        ({**GOOD, "gpus": -2}, "gpus", "greater than or equal to 1"),
        # 8 A100s and 4 V100s: a gang runs on one model, so 8 is the most it can have.
        ({**GOOD, "gpus": 13}, "gpus", "The cluster has 8 GPUs of one model (a gang runs on one GPU model); "
                                       "13 can never be granted"),
        ({**GOOD, "gpus": 9}, "gpus", "The cluster has 8 GPUs of one model"),
        ({**GOOD, "gpus": 6, "gpu_models": ["V100-32GB"]}, "gpus",
         "The cluster has 4 GPUs that fit the request (V100-32GB); 6 can never be granted"),
        ({**GOOD, "gpus": 2, "gpu_milli": 500}, "gpu_milli", "only possible with gpus=1"),
        ({**GOOD, "gpus": 1, "gpu_milli": 1001}, "gpu_milli", "less than or equal to 1000"),
        ({**GOOD, "gpu_models": ["K80"]}, "gpu_models", "Unknown GPU model(s) K80"),
        ({**GOOD, "priority": 99}, "priority", "less than or equal to 10"),
        ({**GOOD, "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}, "env", "cannot be overridden: CUDA_VISIBLE_DEVICES"),
        ({**GOOD, "env": {"1BAD": "x"}}, "env", "Invalid variable name(s): 1BAD"),
        ({**GOOD, "env": {"EPOCHS": 3}}, "env", "valid string"),
        ({**GOOD, "max_runtime_s": 0}, "max_runtime_s", "greater than or equal to 1"),
        ({**GOOD, "gpus": "two"}, "gpus", "valid integer"),
        ({k: v for k, v in GOOD.items() if k != "gpus"}, "gpus", "required"),
        ({**GOOD, "gpu_memory_mib": 90000}, "gpu_memory_mib", "No GPU has 90000 MiB; the largest has 81920 MiB"),
        ({**GOOD, "gpu_memory_mib": 0}, "gpu_memory_mib", "greater than or equal to 1"),
        ({**GOOD, "command": []}, "command", "Give the program to run"),
        ({**GOOD, "command": "python train.py"}, "command", "list"),
        ({**GOOD, "command": ["python", 3]}, "command", "string"),
        ({**GOOD, "command": [" "]}, "command", "must not be blank"),
        ({**GOOD, "command": ["x"] * 300}, "command", "At most 256 arguments"),
        ({**GOOD, "gpu": 1}, "gpu", "Unknown field"),
        ({**GOOD, "tenant": "nope"}, "tenant", "Unknown tenant 'nope'"),
        ({**GOOD, "tenant": "nlp"}, "tenant", "Unknown tenant 'nlp'"),  # exists, but not hers
    ],
)
def test_bad_submission_is_refused_naming_the_field_and_creates_nothing(api, alice, charlie, inventory,
                                                                         payload, field, words):
    response = api(alice).post(URL, payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    errors = response.json()["error"]["fields"]
    assert field in errors, errors
    assert words in str(errors[field])
    assert not Job.objects.exists()


@pytest.mark.parametrize("body", ["[1, 2]", "not json", '"just a string"'])
def test_body_that_is_not_a_json_object_is_refused(api, alice, body):
    response = api(alice).post(URL, body, content_type="application/json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_oversized_payload_is_refused(api, alice, settings):
    payload = {**GOOD, "name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    response = api(alice).post(URL, payload, format="json")
    assert response.status_code in (400, 413)
    assert not Job.objects.exists()


def test_member_of_several_tenants_must_choose(api, alice, inventory):
    MembershipFactory(user=alice, tenant=TenantFactory(slug="speech"))
    assert api(alice).post(URL, GOOD, format="json").json()["error"]["fields"]["tenant"] == [
        "You belong to several tenants; say which one."
    ]
    assert api(alice).post(URL, {**GOOD, "tenant": "speech"}, format="json").json()["tenant"] == "speech"


def test_before_any_node_registers_submissions_are_accepted_and_wait(api, alice):
    response = api(alice).post(URL, {**GOOD, "gpus": 64}, format="json")
    assert response.status_code == 201


def test_anonymous_requests_are_refused(api):
    assert api().get(URL).status_code in (401, 403)
    assert api().post(URL, GOOD, format="json").status_code in (401, 403)


def test_token_from_username_and_password_authenticates(client, alice):
    response = client.post("/api/v1/auth/token/", {"username": "alice", "password": "correct-horse-battery"})
    token = response.json()["token"]
    assert ApiToken.objects.get(user=alice).ending == token[-4:]  # a token that expires (test_api_token_expiry.py)
    listing = client.get(URL, HTTP_AUTHORIZATION=f"Token {token}")
    assert listing.status_code == 200


# ------------------------------------------------------------------ tenancy: owner, teammate, outsider


def test_teammate_sees_the_job_and_outsider_gets_404(api, alice, bob, charlie):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    assert api(alice).get(f"{URL}{job.pk}/").status_code == 200
    assert api(bob).get(f"{URL}{job.pk}/").status_code == 200
    assert api(charlie).get(f"{URL}{job.pk}/").status_code == 404


def test_lists_hold_only_own_tenants_jobs(api, alice, charlie):
    mine = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    theirs = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)
    ids = [j["id"] for j in api(alice).get(URL).json()["results"]]
    assert ids == [mine.pk]
    # Filtering by the other tenant's name reveals nothing either.
    assert api(alice).get(URL, {"tenant": "nlp"}).json()["results"] == []
    assert [j["id"] for j in api(charlie).get(URL).json()["results"]] == [theirs.pk]


def test_outsider_cannot_cancel(api, alice, charlie):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    assert api(charlie).post(f"{URL}{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_staff_operator_sees_every_tenant(api, alice, charlie):
    from tests.factories import UserFactory

    JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)
    operator = UserFactory(username="operator", is_staff=True)
    assert api(operator).get(URL).json()["count"] == 2


def test_state_filter(api, alice):
    tenant = alice.memberships.get().tenant
    JobFactory(tenant=tenant, owner=alice, state=JobState.SUCCEEDED)
    pending = JobFactory(tenant=tenant, owner=alice)
    assert [j["id"] for j in api(alice).get(URL, {"state": "pending"}).json()["results"]] == [pending.pk]
    assert api(alice).get(URL, {"state": "finished"}).json()["count"] == 1
    assert api(alice).get(URL, {"owner": "me", "state": "active"}).json()["count"] == 1


def test_an_unknown_state_is_a_400_that_names_the_states_there_are(api, alice):
    response = api(alice).get(URL, {"state": "pending,runing"})
    assert response.status_code == 400
    assert "runing" in str(response.json()) and "running" in str(response.json())


# ------------------------------------------------------------------ cancel


def test_cancelling_a_pending_job_ends_it_at_once(api, alice):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice)
    response = api(alice).post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "CANCELLED"
    assert response.json()["finished_at"]


def test_cancelling_a_finished_job_is_a_conflict(api, alice):
    job = JobFactory(tenant=alice.memberships.get().tenant, owner=alice, state=JobState.SUCCEEDED)
    response = api(alice).post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 409
    assert "succeeded" in response.json()["error"]["message"]


def test_openapi_schema_describes_the_jobs_api(api, alice):
    response = api(alice).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    import json

    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/jobs/" in schema["paths"]
    assert "/api/v1/jobs/{id}/cancel/" in schema["paths"]
    submit = schema["components"]["schemas"]["JobSubmit"]
    assert set(submit["required"]) == {"command", "gpus"}


def test_an_empty_command_is_refused_in_plain_words(alice, api):
    body = api(alice).post("/api/v1/jobs/", {"command": [], "gpus": 1}, format="json").json()["error"]
    assert body["fields"]["command"] == ['Give the program to run, e.g. ["python", "train.py"].']
    assert "elements" not in body["message"]


def test_a_pending_job_says_when_it_may_start(api, alice, vision):
    """``pending_reason.eta_at``: the scheduler's estimate as a time, as docs/jobs.md says; null without one."""
    import time
    from datetime import datetime, timezone

    eta_at = int(time.time()) + 720
    reason = {"code": "waiting_for_free_gpus", "message": "Waiting for 2 GPUs", "details": {}}
    waiting = JobFactory(tenant=vision, owner=alice, pending_reason={**reason, "eta_at": eta_at})
    unknown = JobFactory(tenant=vision, owner=alice, pending_reason=reason)
    shown = api(alice).get(f"{URL}{waiting.pk}/").json()["pending_reason"]
    assert (datetime.fromisoformat(shown["eta_at"].replace("Z", "+00:00"))
            == datetime.fromtimestamp(eta_at, timezone.utc))
    assert api(alice).get(f"{URL}{unknown.pk}/").json()["pending_reason"]["eta_at"] is None
    queued = {job["id"]: job for job in api(alice).get("/api/v1/queue/").json()["results"]}
    assert queued[waiting.pk]["pending_reason"]["eta_at"] == shown["eta_at"]
