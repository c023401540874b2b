"""Cancelling many jobs in one request (``POST /api/v1/jobs/cancel/``) and cancelling a job's
``after_ok`` chain: a fixed handful of statements per level of the chain, never one per job,
with the timeline, errors and notifications each dependant had when they went one by one."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import protocol
from jobs.choices import JobEventKind, JobState, Role
from jobs.models import Job, JobDependency, JobEvent, JobWait, Membership, Notification, NotificationSettings
from tests.factories import GpuFactory, JobFactory, NodeFactory, running_job

WIDE = 300


def dependants_of(root: Job, count: int) -> list[Job]:
    jobs = Job.objects.bulk_create([Job(tenant=root.tenant, owner=root.owner, name=f"after-{i}", command=["x"], gpus=1)
                                    for i in range(count)])
    JobDependency.objects.bulk_create([JobDependency(job=job, on=root, kind=JobDependency.Kind.OK) for job in jobs])
    JobWait.objects.bulk_create([JobWait(job=job, reason={"code": "waiting_for_dependency", "message": "w",
                                                          "details": {}}) for job in jobs])
    return jobs


def cancel_many(client, ids):
    return client.post("/api/v1/jobs/cancel/", {"ids": ids}, format="json")


def test_cancelling_a_job_with_300_after_ok_dependants_ends_them_all_in_a_bounded_number_of_queries(
        alice, api, vision):
    root = JobFactory(tenant=vision, owner=alice)
    wide = dependants_of(root, WIDE)
    deeper = dependants_of(wide[7], 20)  # and theirs, down the chain
    deepest = dependants_of(deeper[0], 1)
    after_any = JobFactory(tenant=vision, owner=alice)
    JobDependency.objects.create(job=after_any, on=root, kind=JobDependency.Kind.ANY)

    with CaptureQueriesContext(connection) as queries:
        response = cancel_many(api(alice), [root.pk])
    assert response.status_code == 200, response.content
    assert response.json() == {"cancelled": [root.pk], "stopping": [], "skipped": []}
    # A handful per level of the chain (three levels below the root here), whatever its width:
    # one by one it was about seven per dependant.
    assert len(queries) <= 40, "\n".join(q["sql"][:150] for q in queries.captured_queries)

    chain = [*wide, *deeper, *deepest]
    states = set(Job.objects.filter(pk__in=[j.pk for j in chain]).values_list("state", flat=True))
    assert states == {JobState.CANCELLED}
    assert Job.objects.get(pk=after_any.pk).state == JobState.PENDING  # after_any runs however root ended
    assert not JobWait.objects.filter(job__in=chain).exists()
    first, second, third = (Job.objects.get(pk=j.pk) for j in (wide[0], deeper[0], deepest[0]))
    assert first.error == f"Cancelled: job {root.pk}, which it ran after (after_ok), ended cancelled."
    assert second.error == f"Cancelled: job {wide[7].pk}, which it ran after (after_ok), ended cancelled."
    assert third.error == f"Cancelled: job {deeper[0].pk}, which it ran after (after_ok), ended cancelled."
    assert first.finished_at is not None
    finished = JobEvent.objects.filter(job__in=chain, kind=JobEventKind.FINISHED)
    assert finished.count() == len(chain)
    assert finished.get(job=second).message == second.error


def test_one_cancel_through_the_single_endpoint_cuts_the_chain_the_same_way(alice, api, vision):
    root = JobFactory(tenant=vision, owner=alice)
    wide = dependants_of(root, WIDE)
    with CaptureQueriesContext(connection) as queries:
        response = api(alice).post(f"/api/v1/jobs/{root.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == JobState.CANCELLED
    assert len(queries) <= 40
    assert Job.objects.filter(pk__in=[j.pk for j in wide], state=JobState.CANCELLED).count() == WIDE


def test_opted_in_owners_hear_of_their_dependants_as_one_failure(alice, bob, api, vision):
    alice.email, bob.email = "alice@example.org", "bob@example.org"
    alice.save(update_fields=["email"])
    bob.save(update_fields=["email"])
    NotificationSettings.objects.create(user=alice, email=True, events=["failed"])
    NotificationSettings.objects.create(user=bob, email=True, events=["succeeded"])  # not failures
    root = JobFactory(tenant=vision, owner=alice)
    dependants_of(root, 3)  # alice's own: still one message for the chain
    bobs = JobFactory(tenant=vision, owner=bob)
    JobDependency.objects.create(job=bobs, on=root, kind=JobDependency.Kind.OK)

    assert cancel_many(api(alice), [root.pk]).status_code == 200
    # One message naming the root (tests/jobs/test_chain_cancel_notification.py), not one per
    # dependant; bob asked for no failures.
    told = list(Notification.objects.values_list("user_id", "event", "job_id"))
    assert told == [(alice.pk, "chain_cancelled", root.pk)]
    assert Job.objects.get(pk=bobs.pk).state == JobState.CANCELLED


def test_many_jobs_in_one_request_pending_end_running_stop_and_the_rest_say_why(
        alice, bob, charlie, api, vision, redis_client, live_redis, django_capture_on_commit_callbacks):
    node = NodeFactory(name="n1")
    gpu = GpuFactory(node=node, index=0)
    pending = [JobFactory(tenant=vision, owner=alice) for _ in range(3)]
    running = running_job(vision, alice, [gpu], attempt=2)
    ended = JobFactory(tenant=vision, owner=alice, state=JobState.SUCCEEDED)
    teammates = JobFactory(tenant=vision, owner=bob)
    outsiders = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)

    ids = [*(j.pk for j in pending), running.pk, ended.pk, teammates.pk, outsiders.pk, 999_999]
    with django_capture_on_commit_callbacks(execute=True):
        response = cancel_many(api(alice), ids)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["cancelled"] == [j.pk for j in pending] and body["stopping"] == [running.pk]
    reasons = {item["id"]: item["reason"] for item in body["skipped"]}
    assert reasons == {
        ended.pk: "it has ended (succeeded)",
        teammates.pk: f"Only its owner (bob), a lead of tenant vision or an operator can cancel job {teammates.pk}.",
        outsiders.pk: "no such job",  # as a single cancel's 404: alice learns nothing of nlp's jobs
        999_999: "no such job",
    }
    assert Job.objects.get(pk=running.pk).state == JobState.CANCELLING
    assert {Job.objects.get(pk=j.pk).state for j in (teammates, outsiders)} == {JobState.PENDING}
    assert JobEvent.objects.get(job=running, kind=JobEventKind.STOPPING).attempt == 2
    stops = [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
             if isinstance(c := protocol.decode_command(f), protocol.StopJob)]
    assert [(s.job_id, s.launch_id) for s in stops] == [(running.pk, f"launch-{running.pk}-2")]

    again = cancel_many(api(alice), [running.pk]).json()
    assert again["skipped"] == [{"id": running.pk, "reason": "being cancelled already"}]


def test_a_lead_cancels_teammates_jobs_and_an_operator_anyones(alice, bob, charlie, operator, api, vision):
    Membership.objects.filter(user=bob, tenant=vision).update(role=Role.LEAD)
    alices, charlies = JobFactory(tenant=vision, owner=alice), JobFactory(tenant=charlie.memberships.get().tenant,
                                                                          owner=charlie)
    assert cancel_many(api(bob), [alices.pk, charlies.pk]).json()["cancelled"] == [alices.pk]
    assert cancel_many(api(operator), [charlies.pk]).json()["cancelled"] == [charlies.pk]


@pytest.mark.parametrize("body, field, words", [
    ({"ids": []}, "ids", "Name at least one job."),
    ({"ids": ["x"]}, "ids", "valid integer"),
    ({"ids": list(range(1, 10_002))}, "ids", "At most 10,000 jobs at once."),
    ({"ids": [1], "name": "sweep-*"}, "name", "Unknown field."),
])
def test_a_bad_bulk_cancel_is_refused_and_cancels_nothing(alice, api, vision, body, field, words):
    job = JobFactory(tenant=vision, owner=alice)
    response = api(alice).post("/api/v1/jobs/cancel/", body, format="json")
    assert response.status_code == 400
    assert words in str(response.json()["error"]["fields"][field])
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_bulk_cancel_needs_a_signed_in_user(api, alice, vision):
    job = JobFactory(tenant=vision, owner=alice)
    assert cancel_many(api(), [job.pk]).status_code in (401, 403)
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
