"""A job ends, fails, is preempted or waits too long: its owner hears about it on the channels they
chose, once, by email (Django's outbox) and by webhook (a real HTTP server on 127.0.0.1); failures
are retried and then given up on, and nothing of it can break the lifecycle that reported it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.choices import JobEventKind, JobState
from jobs.models import JobEvent, Notification, NotificationSettings
from jobs.services import notifications
from jobs.tasks import notify_long_waits, send_notification
from tests.factories import JobFactory, UserFactory
from tests.jobs.notification_helpers import eager_celery, webhook  # noqa: F401 (fixtures)


@pytest.fixture
def alice(db):
    return UserFactory(username="alice", email="alice@example.org")


def opt_in(user, events=("succeeded", "failed", "preempted", "long_wait"), email=True, webhook_url="", minutes=60):
    return NotificationSettings.objects.create(user=user, email=email, webhook_url=webhook_url, events=list(events),
                                               long_wait_minutes=minutes)


def failed_job(owner, **fields):
    defaults = {"name": "train.py", "state": JobState.FAILED, "exit_code": 1, "attempt": 1,
                "error": "CUDA error: out of memory", "output_tail": "epoch 1\nTraceback ...\nRuntimeError: boom"}
    return JobFactory(owner=owner, **{**defaults, **fields})


def fire(job, event, capture):
    """As the lifecycle does: inside the transaction that changes the state; sent after commit."""
    with capture(execute=True):
        with transaction.atomic():
            notifications.job_event(job.pk, event)


def test_failed_job_is_mailed_to_its_owner_with_a_link(alice, eager_celery, django_capture_on_commit_callbacks,
                                                       settings):
    settings.COLONY_PUBLIC_URL = "https://colony.example.org"
    opt_in(alice)
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.org"]
    assert message.subject == f"Colony: job {job.pk} train.py failed (exit 1)"
    assert f"https://colony.example.org/jobs/{job.pk}/" in message.body
    assert "Exit code: 1" in message.body and "CUDA error: out of memory" in message.body
    assert "RuntimeError: boom" in message.body  # short output comes along
    assert Notification.objects.get().state == Notification.State.SENT


def test_long_output_stays_out_of_the_message(alice, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice)
    job = failed_job(alice, output_tail="\n".join("x" * 400 for _ in range(20)))

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert "xxxx" not in mail.outbox[0].body


def test_webhook_receives_slack_json(alice, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, email=False, webhook_url=webhook.url)
    job = JobFactory(owner=alice, name="bert", state=JobState.SUCCEEDED, exit_code=0, attempt=1)

    fire(job, "succeeded", django_capture_on_commit_callbacks)

    [payload] = webhook.received
    assert payload["text"].startswith(f"Colony: job {job.pk} bert succeeded")
    assert f"/jobs/{job.pk}/" in payload["text"]
    assert payload["blocks"][0]["type"] == "section"
    assert f"/jobs/{job.pk}/|Job {job.pk} bert succeeded>" in payload["blocks"][0]["text"]["text"]
    assert mail.outbox == []


def test_the_same_event_twice_sends_one_message(alice, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, webhook_url=webhook.url)
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)
    fire(job, "failed", django_capture_on_commit_callbacks)
    fire(job, "timeout", django_capture_on_commit_callbacks)  # one failure of this attempt, however named

    assert len(mail.outbox) == 1 and len(webhook.received) == 1
    assert Notification.objects.count() == 2  # one per channel


def test_a_second_attempt_is_a_new_message(alice, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice)
    job = JobFactory(owner=alice, state=JobState.PENDING, attempt=1)
    fire(job, "preempted", django_capture_on_commit_callbacks)
    job.attempt = 2
    job.save(update_fields=["attempt"])
    fire(job, "preempted", django_capture_on_commit_callbacks)

    assert [m.subject for m in mail.outbox] == [f"Colony: job {job.pk} {job.name} was preempted and is back "
                                                f"in the queue"] * 2


def test_only_chosen_events_are_sent_and_cancel_never(alice, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, events=["failed"])
    fire(failed_job(alice, state=JobState.SUCCEEDED, exit_code=0), "succeeded", django_capture_on_commit_callbacks)
    fire(failed_job(alice, state=JobState.CANCELLED), "cancelled", django_capture_on_commit_callbacks)
    fire(failed_job(alice, state=JobState.TIMEOUT, exit_code=None, max_runtime_s=60), "timeout",
         django_capture_on_commit_callbacks)

    assert [m.subject.split(" ", 4)[-1] for m in mail.outbox] == ["timed out (limit 60 s)"]


def test_user_without_settings_costs_one_query_and_gets_nothing(alice, django_capture_on_commit_callbacks):
    job = failed_job(alice)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        notifications.job_event(job.pk, "failed")
    statements = [q["sql"] for q in queries if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 1
    assert Notification.objects.count() == 0


def test_nothing_is_sent_if_the_state_change_rolls_back(alice, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice)
    job = failed_job(alice)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            notifications.job_event(job.pk, "failed")
            raise RuntimeError("the lifecycle's update failed")

    assert mail.outbox == [] and Notification.objects.count() == 0


def test_a_broken_notification_never_breaks_the_lifecycle(alice, monkeypatch, django_capture_on_commit_callbacks):
    opt_in(alice)
    job = failed_job(alice)

    def broken(*args, **kwargs):
        raise RuntimeError("database trouble")

    monkeypatch.setattr(Notification.objects, "get_or_create", broken)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        notifications.job_event(job.pk, "failed")  # must not raise
        job.refresh_from_db()  # and the caller's transaction still works
    assert job.state == JobState.FAILED


def test_job_event_does_no_network_io_when_the_broker_is_down(alice, django_capture_on_commit_callbacks, settings):
    from cluster_ui.celery import app

    opt_in(alice)
    job = failed_job(alice)
    previous = app.conf.broker_url
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            notifications.job_event(job.pk, "failed")  # the enqueue fails after commit, quietly
    finally:
        app.conf.broker_url = previous
    assert Notification.objects.get().state == Notification.State.PENDING  # redelivered later
    assert mail.outbox == []


def test_webhook_500_is_retried_then_delivered(alice, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, email=False, webhook_url=webhook.url)
    webhook.statuses = [500, 503]
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert len(webhook.received) == 3
    notification = Notification.objects.get()
    assert (notification.state, notification.attempts, notification.last_error) == (Notification.State.SENT, 3, "")


def test_webhook_gives_up_after_five_tries(alice, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, email=False, webhook_url=webhook.url)
    webhook.statuses = [500] * 10
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert len(webhook.received) == notifications.MAX_TRIES == 5
    notification = Notification.objects.get()
    assert notification.state == Notification.State.FAILED
    assert notification.attempts == 5
    assert "500" in notification.last_error


def test_webhook_redirect_is_not_followed(alice, webhook, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, email=False, webhook_url=webhook.url)
    webhook.statuses = [302]
    webhook.headers[302] = {"Location": "http://169.254.169.254/latest/meta-data/"}
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert len(webhook.received) == 1
    notification = Notification.objects.get()
    assert notification.state == Notification.State.FAILED
    assert "redirects are not followed" in notification.last_error


def test_webhook_that_now_resolves_inside_is_refused_when_sending(alice, webhook, eager_celery, settings,
                                                                  django_capture_on_commit_callbacks):
    opt_in(alice, email=False, webhook_url=webhook.url)  # saved while 127.0.0.1 was allowed
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = []
    job = failed_job(alice)

    fire(job, "failed", django_capture_on_commit_callbacks)

    assert webhook.received == []
    notification = Notification.objects.get()
    assert notification.state == Notification.State.FAILED
    assert "internal address" in notification.last_error


def test_a_task_enqueued_twice_sends_once(alice, webhook):
    opt_in(alice, email=False, webhook_url=webhook.url)
    notification = Notification.objects.create(user=alice, job=failed_job(alice), event="failed", channel="webhook",
                                               dedupe_key="x")
    send_notification.apply(args=(notification.pk,))
    send_notification.apply(args=(notification.pk,))  # e.g. redelivered while the first ran
    assert len(webhook.received) == 1


def test_redelivery_sends_what_the_broker_lost(alice, eager_celery):
    opt_in(alice)
    notification = Notification.objects.create(user=alice, job=failed_job(alice), event="failed", channel="email",
                                               dedupe_key="lost")
    Notification.objects.filter(pk=notification.pk).update(created_at=timezone.now() - timedelta(minutes=6))

    assert notifications.redeliver_stuck() == 1
    assert len(mail.outbox) == 1


def test_turning_email_off_before_sending_stops_the_message(alice, eager_celery):
    prefs = opt_in(alice)
    notification = Notification.objects.create(user=alice, job=failed_job(alice), event="failed", channel="email",
                                               dedupe_key="k")
    prefs.email = False
    prefs.save()
    send_notification.apply(args=(notification.pk,))
    assert mail.outbox == []
    assert Notification.objects.get().state == Notification.State.FAILED


# ---------------------------------------------------------------- long waits


def test_long_wait_is_told_once_per_wait(alice, eager_celery, django_capture_on_commit_callbacks):
    opt_in(alice, minutes=30)
    now = timezone.now()
    waiting = JobFactory(owner=alice, name="big-gang", state=JobState.PENDING,
                         pending_reason={"code": "gang", "message": "Needs 8 GPUs on one node."})
    fresh = JobFactory(owner=alice, state=JobState.PENDING)
    running = JobFactory(owner=alice, state=JobState.RUNNING)
    for job, minutes in ((waiting, 45), (fresh, 10), (running, 120)):
        type(job).objects.filter(pk=job.pk).update(submitted_at=now - timedelta(minutes=minutes))

    with django_capture_on_commit_callbacks(execute=True):  # beat runs it outside any transaction
        assert notify_long_waits.apply().get() == 1
        assert notify_long_waits.apply().get() == 0  # the next tick: already told

    [message] = mail.outbox
    assert message.subject == f"Colony: job {waiting.pk} big-gang has waited 45 min in the queue"
    assert "Waiting because: Needs 8 GPUs on one node." in message.body


def test_long_wait_counts_from_the_last_requeue(alice, eager_celery):
    opt_in(alice, minutes=30)
    now = timezone.now()
    job = JobFactory(owner=alice, state=JobState.PENDING, attempt=1)
    type(job).objects.filter(pk=job.pk).update(submitted_at=now - timedelta(hours=5))
    JobEvent.objects.create(job=job, attempt=1, kind=JobEventKind.REQUEUED, at=now - timedelta(minutes=5))

    assert notifications.notify_long_waits(now) == 0  # back in the queue 5 min ago
    assert notifications.notify_long_waits(now + timedelta(minutes=31)) == 1
    # Preempted again and waiting again: a new wait, a new message.
    Job = type(job)
    Job.objects.filter(pk=job.pk).update(attempt=2)
    JobEvent.objects.create(job=job, attempt=2, kind=JobEventKind.REQUEUED, at=now + timedelta(minutes=40))
    assert notifications.notify_long_waits(now + timedelta(minutes=60)) == 0
    assert notifications.notify_long_waits(now + timedelta(minutes=71)) == 1


def test_long_wait_only_for_users_who_asked(alice, eager_celery):
    opt_in(alice, events=["failed"])
    bob = UserFactory(username="bob", email="bob@example.org")
    for owner in (alice, bob):
        job = JobFactory(owner=owner, state=JobState.PENDING)
        type(job).objects.filter(pk=job.pk).update(submitted_at=timezone.now() - timedelta(days=1))

    assert notifications.notify_long_waits() == 0
    assert mail.outbox == []


def test_long_wait_message_is_dropped_if_the_job_started_meanwhile(alice, eager_celery):
    opt_in(alice, minutes=1)
    job = JobFactory(owner=alice, state=JobState.PENDING)
    notification = Notification.objects.create(user=alice, job=job, event="long_wait", channel="email",
                                               dedupe_key="w")
    type(job).objects.filter(pk=job.pk).update(state=JobState.RUNNING)

    send_notification.apply(args=(notification.pk,))

    assert mail.outbox == []
    assert "started before" in Notification.objects.get().last_error


def test_an_unexpected_error_is_retried_and_then_given_up(alice, eager_celery, monkeypatch,
                                                          django_capture_on_commit_callbacks):
    opt_in(alice)
    job = failed_job(alice)

    def broken(*args, **kwargs):
        raise KeyError("template")

    monkeypatch.setattr(notifications, "render", broken)
    fire(job, "failed", django_capture_on_commit_callbacks)

    notification = Notification.objects.get()
    assert (notification.state, notification.attempts) == (Notification.State.FAILED, notifications.MAX_TRIES)
    assert "Internal error" in notification.last_error
