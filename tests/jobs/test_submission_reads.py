"""A single submission reads what it checks once (the submitter's tenants with their caps, the
waiting count, the new job's timeline) and answers as before: the same refusals, the same job."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Job
from tests.factories import JobFactory, MembershipFactory

URL = "/api/v1/jobs/"
JOB = {"command": ["python", "train.py"], "gpus": 2}


def test_each_tenant_keeps_its_own_cap_and_a_stranger_is_refused(api, alice, vision, nlp, inventory):
    MembershipFactory(user=alice, tenant=nlp, max_gpus=1)
    client = api(alice)
    capped = client.post(URL, {**JOB, "tenant": "nlp"}, format="json")
    assert capped.status_code == 400
    assert capped.json()["error"]["fields"]["gpus"] == [
        "A lead of tenant nlp lets you hold at most 1 GPU there at once; a job of 2 could never start. "
        "Ask them to raise your limit."]
    assert client.post(URL, {**JOB, "tenant": "vision"}, format="json").status_code == 201
    mixed = client.post(URL, JOB, format="json")
    assert mixed.json()["error"]["fields"]["tenant"] == ["You belong to several tenants; say which one."]
    stranger = client.post(URL, {**JOB, "tenant": "elsewhere"}, format="json")
    assert stranger.json()["error"]["fields"]["tenant"] == [
        "Unknown tenant 'elsewhere', or you are not a member of it."]


def test_the_waiting_count_is_the_submitters_own(api, alice, bob, vision, inventory, settings):
    settings.COLONY_MAX_PENDING_PER_USER = 2
    JobFactory(tenant=vision, owner=bob)
    JobFactory(tenant=vision, owner=alice)
    JobFactory(tenant=vision, owner=alice, state="RUNNING")
    assert api(alice).post(URL, JOB, format="json").status_code == 201
    full = api(alice).post(URL, JOB, format="json")
    assert full.status_code == 400
    assert "You have 2 jobs waiting; at most 2 may wait at once" in str(full.json())


def test_the_answer_is_the_job_as_read_back(api, alice, inventory):
    answer = api(alice).post(URL, {**JOB, "name": "train"}, format="json").json()
    read_back = api(alice).get(f"{URL}{answer['id']}/").json()
    assert answer == {**read_back, "eta_s": answer["eta_s"]}
    assert [event["kind"] for event in answer["events"]] == ["submitted"]
    assert answer["events"][0]["message"] == "By alice to vision."
    assert answer["allocations"] == [] and answer["dependencies"] == []


def test_a_submission_reads_each_fact_once(api, alice, inventory):
    client = api(alice)
    client.post(URL, JOB, format="json")  # the inventory and the compiled reads, once per process
    with CaptureQueriesContext(connection) as captured:
        assert client.post(URL, JOB, format="json").status_code == 201
    # The inventory is read from the database inside a test's transaction; in a request it is
    # cached (monitoring.services.registry) and has its own tests.
    statements = [q["sql"] for q in captured.captured_queries if "monitoring_" not in q["sql"]]
    assert len([s for s in statements if s.startswith("SELECT")]) == 2, statements  # tenants+caps, waiting
    assert len([s for s in statements if s.startswith("INSERT")]) == 2, statements  # the job, its SUBMITTED event
    assert Job.objects.filter(owner=alice).count() == 2
