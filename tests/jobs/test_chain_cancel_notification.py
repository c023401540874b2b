"""Cancelling a job with after_ok dependants tells their owner once: one message (per channel)
that names the job whose ending cut the chain and counts the jobs cancelled with it, not one per
dependant. Driven through the API's cancel endpoints; mail is Django's outbox, the webhook a real
HTTP server on 127.0.0.1."""

from __future__ import annotations

from django.core import mail

from jobs.choices import JobState
from jobs.models import Job, JobDependency, Notification, NotificationSettings
from tests.factories import JobFactory
from tests.jobs.notification_helpers import eager_celery, webhook  # noqa: F401 (fixtures)


def after_ok(root: Job, count: int, **fields) -> list[Job]:
    jobs = [JobFactory(tenant=root.tenant, owner=fields.pop("owner", root.owner), name="sweep", **fields)
            for _ in range(count)]
    JobDependency.objects.bulk_create([JobDependency(job=job, on=root, kind=JobDependency.Kind.OK) for job in jobs])
    return jobs


def opt_in(user, **channels):
    user.email = f"{user.username}@example.org"
    user.save(update_fields=["email"])
    NotificationSettings.objects.create(user=user, events=["failed"], **{"email": True, **channels})


def test_a_cancelled_chain_is_one_message_naming_its_root_and_counting_it(
        alice, vision, api, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, webhook_url=webhook.url)
    root = JobFactory(tenant=vision, owner=alice, name="prepare-data")
    wide = after_ok(root, 12)
    deeper = after_ok(wide[3], 2)  # and theirs, down the chain

    with django_capture_on_commit_callbacks(execute=True):
        response = api(alice).post(f"/api/v1/jobs/{root.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == JobState.CANCELLED
    assert Job.objects.filter(pk__in=[j.pk for j in wide + deeper], state=JobState.CANCELLED).count() == 14

    assert [m.subject for m in mail.outbox] == [
        f"Colony: job {root.pk} prepare-data cancelled, and 14 jobs that depended on it"]
    body = mail.outbox[0].body
    assert f"/jobs/{root.pk}/" in body
    chain = sorted(j.pk for j in wide + deeper)
    assert f"jobs {', '.join(map(str, chain[:10]))} and 4 more" in body
    assert len(webhook.received) == 1
    assert f"job {root.pk} prepare-data cancelled, and 14 jobs" in webhook.received[0]["text"]
    assert Notification.objects.filter(user=alice).count() == 2  # one per channel, none per dependant


def test_the_bulk_cancel_tells_each_owner_of_their_own_dependants_once(
        alice, bob, vision, api, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice)
    opt_in(bob)
    root = JobFactory(tenant=vision, owner=alice, name="tokenize")
    after_ok(root, 3)
    after_ok(root, 1, owner=bob)

    with django_capture_on_commit_callbacks(execute=True):
        response = api(alice).post("/api/v1/jobs/cancel/", {"ids": [root.pk]}, format="json")
    assert response.status_code == 200, response.content
    by_user = sorted((m.to[0], m.subject) for m in mail.outbox)
    assert by_user == [
        ("alice@example.org", f"Colony: job {root.pk} tokenize cancelled, and 3 jobs that depended on it"),
        ("bob@example.org", f"Colony: job {root.pk} tokenize cancelled, and 1 job that depended on it"),
    ]


def test_a_dependant_cancelled_by_hand_is_no_chain(alice, vision, api, eager_celery,
                                                   django_capture_on_commit_callbacks):
    """Cancelling the dependant itself tells nothing, as any cancel (the user asked for it); the
    chain's message comes only from a job whose ending cut it."""
    opt_in(alice)
    root = JobFactory(tenant=vision, owner=alice)
    (dependant,) = after_ok(root, 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert api(alice).post(f"/api/v1/jobs/{dependant.pk}/cancel/").status_code == 200
    assert mail.outbox == [] and not Notification.objects.exists()


def test_a_failed_root_is_named_as_failed_beside_its_own_failure_message(
        alice, vision, api, db, redis_client, live_redis, eager_celery, django_capture_on_commit_callbacks):
    import time

    from agents import protocol
    from jobs.services.agent_events import consume_events
    from jobs.services.scheduling_loop import run_scheduling_cycle
    from tests.factories import GpuFactory, NodeFactory

    GpuFactory(node=NodeFactory(name="n1"), index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    opt_in(alice)
    root = JobFactory(tenant=vision, owner=alice, name="train")
    after_ok(root, 2)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    launch = f"launch-{root.pk}-1"
    for message in (protocol.JobStarted(node="n1", job_id=root.pk, pid=7, started_at=time.time(), launch_id=launch),
                    protocol.JobExited(node="n1", job_id=root.pk, exit_code=3, finished_at=time.time(),
                                       launch_id=launch)):
        redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with django_capture_on_commit_callbacks(execute=True):
        consume_events(redis_client)
    assert sorted(m.subject for m in mail.outbox) == [
        f"Colony: job {root.pk} train failed (exit 3)",
        f"Colony: job {root.pk} train failed; 2 jobs that depended on it were cancelled"]
