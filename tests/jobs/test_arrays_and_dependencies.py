"""Job arrays and dependencies through the API: one submission makes one job per index, and a
job that runs after another that cannot succeed any more is cancelled, down the chain."""

import time

import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Job, JobEvent, Notification, NotificationSettings
from jobs.services.agent_events import consume_events
from jobs.services.arrays import parse
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.submission import cancel_job
from tests.factories import GpuFactory, JobFactory, NodeFactory


def submit(client, **spec):
    return client.post("/api/v1/jobs/", {"command": ["python", "sweep.py"], "gpus": 1, **spec}, format="json")


def test_an_array_submission_makes_one_job_per_index_and_says_so(alice, api):
    response = submit(api(alice), array="0-9:3,20%2")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["array"]["size"] == 5 and body["array"]["max_running"] == 2 and body["array"]["spec"] == "0-9:3,20%2"
    jobs = list(Job.objects.filter(pk__in=body["jobs"]).order_by("array_index"))
    assert [j.array_index for j in jobs] == [0, 3, 6, 9, 20]
    assert {j.array_id for j in jobs} == {body["array"]["id"]} and {j.state for j in jobs} == {JobState.PENDING}
    event = JobEvent.objects.get(job=jobs[1])
    assert f"as index 3 of array {body['array']['id']}" in event.message
    shown = api(alice).get(f"/api/v1/jobs/{jobs[1].pk}/").json()
    assert (shown["array_id"], shown["array_index"]) == (body["array"]["id"], 3)


@pytest.mark.parametrize("spec, words", [
    ("0-", "is not an index or a range"),
    ("5-1", "empty range"),
    ("0-99%0", "at least 1"),
    ("0-5000", "at most 1000 jobs"),
    ("", None),  # blank: a plain job
])
def test_a_bad_array_spec_is_refused_in_words(alice, api, spec, words):
    response = submit(api(alice), array=spec)
    if words is None:
        assert response.status_code == 201 and response.json()["array_id"] is None
        return
    assert response.status_code == 400
    assert words in response.json()["error"]["fields"]["array"][0]


def test_array_specs_read_as_slurm_writes_them():
    assert parse("1,3,5-7", 100).indices == (1, 3, 5, 6, 7)
    assert parse("0-99%8", 100).max_running == 8 and len(parse("0-99%8", 100).indices) == 100
    assert parse("0-98:2", 100).indices[:3] == (0, 2, 4)


def test_dependencies_must_be_visible_jobs_of_the_same_tenant(alice, charlie, api, vision):
    theirs = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)
    refused = submit(api(alice), after_ok=[theirs.pk])
    assert refused.status_code == 400
    assert f"No job {theirs.pk} in tenant vision" in refused.json()["error"]["fields"]["after_ok"][0]
    failed = JobFactory(tenant=vision, owner=alice, state=JobState.FAILED)
    refused = submit(api(alice), after_ok=[failed.pk])
    assert "could never start" in refused.json()["error"]["fields"]["after_ok"][0]
    ok = submit(api(alice), after_ok=[JobFactory(tenant=vision, owner=alice).pk], after_any=[failed.pk])
    assert ok.status_code == 201
    assert sorted(d["kind"] for d in ok.json()["dependencies"]) == ["any", "ok"]


def test_when_a_job_fails_its_after_ok_chain_is_cancelled_and_after_any_waits_on(
        alice, api, vision, db, redis_client, live_redis, django_capture_on_commit_callbacks):
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    alice.email = "alice@example.org"
    alice.save(update_fields=["email"])
    NotificationSettings.objects.create(user=alice, email=True, events=["failed"])
    first = JobFactory(tenant=vision, owner=alice)
    then = submit(api(alice), after_ok=[first.pk]).json()["id"]
    after_then = submit(api(alice), after_ok=[then]).json()["id"]
    cleanup = submit(api(alice), after_any=[first.pk]).json()["id"]

    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    first.refresh_from_db()
    assert first.state == JobState.PLACED
    assert Job.objects.get(pk=then).pending_reason["code"] == "waiting_for_dependency"
    launch = f"launch-{first.pk}-1"
    for message in (protocol.JobStarted(node="n1", job_id=first.pk, pid=7, started_at=time.time(), launch_id=launch),
                    protocol.JobExited(node="n1", job_id=first.pk, exit_code=3, finished_at=time.time(),
                                       launch_id=launch)):
        redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with django_capture_on_commit_callbacks(execute=True):
        consume_events(redis_client)

    then_job, after_job = Job.objects.get(pk=then), Job.objects.get(pk=after_then)
    assert then_job.state == after_job.state == JobState.CANCELLED
    assert f"job {first.pk}, which it ran after (after_ok), ended failed" in then_job.error
    assert f"job {then}, which it ran after (after_ok), ended cancelled" in after_job.error
    # Nobody cancelled them: their owner, who asked to hear of failures, hears of the failure and
    # of the chain it cut, in one message naming the failed job (not one per dependant).
    told = sorted(Notification.objects.filter(user=alice).values_list("event", "job_id"))
    assert told == [("chain_cancelled", first.pk), ("failed", first.pk)]
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    assert Job.objects.get(pk=cleanup).state == JobState.PLACED  # after_any: runs however first ended


def test_cancelling_a_pending_job_cancels_what_runs_after_it_succeeds(alice, api, vision):
    first = JobFactory(tenant=vision, owner=alice)
    then = submit(api(alice), after_ok=[first.pk]).json()["id"]
    cancel_job(first)
    assert Job.objects.get(pk=then).state == JobState.CANCELLED


def test_one_user_can_queue_only_so_many_jobs_however_they_submit(alice, api, settings):
    settings.COLONY_MAX_PENDING_PER_USER = 10
    client = api(alice)
    assert submit(client, array="0-7").status_code == 201
    refused = submit(client, array="0-2")
    assert refused.status_code == 400
    assert "You have 8 jobs waiting; at most 10 may wait at once" in refused.json()["error"]["message"]
    bulk = client.post("/api/v1/jobs/bulk/", {"jobs": [{"command": ["python", "x.py"], "gpus": 1}] * 3},
                       format="json")
    assert bulk.status_code == 400 and "COLONY_MAX_PENDING_PER_USER" in bulk.json()["error"]["message"]
    assert submit(client).status_code == 201 and submit(client).status_code == 201
    assert submit(client).status_code == 400
    assert Job.objects.filter(owner=alice).count() == 10
