"""The Notifications page: a user sets where and when they hear about their jobs, tries it with a
test message, and sees what was sent (or why not)."""

from __future__ import annotations

import pytest
from django.core import mail

from jobs.models import Notification, NotificationSettings
from tests.factories import JobFactory
from tests.jobs.notification_helpers import webhook  # noqa: F401 (fixture)

URL = "/jobs/notifications/"


@pytest.fixture
def alice_mail(alice):
    alice.email = "alice@example.org"
    alice.save(update_fields=["email"])
    return alice


@pytest.fixture
def page(client, alice_mail):
    client.force_login(alice_mail)
    return client


def test_login_required(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_page_is_in_the_menu(page):
    assert f'href="{URL}"' in page.get("/jobs/").content.decode()


def test_saving_the_form_keeps_the_choices(page, alice_mail):
    response = page.post(URL, {"email": "on", "webhook_url": "", "events": ["failed", "preempted"],
                               "long_wait_minutes": "45", "action": "save"}, follow=True)

    assert "Notification settings saved." in response.content.decode()
    saved = NotificationSettings.objects.get(user=alice_mail)
    assert (saved.email, saved.events, saved.long_wait_minutes) == (True, ["failed", "preempted"], 45)
    html = page.get(URL).content.decode()
    assert 'value="failed" id="id_events_1" checked' in html
    assert 'value="succeeded" id="id_events_0" checked' not in html
    assert "To alice@example.org." in html


def test_internal_webhook_is_refused_in_plain_words(page, alice_mail, settings):
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = []
    response = page.post(URL, {"webhook_url": "http://169.254.169.254/latest/meta-data/", "events": ["failed"],
                               "long_wait_minutes": "60", "action": "save"})

    assert response.status_code == 200
    assert "169.254.169.254 is an internal address" in response.content.decode()
    assert not NotificationSettings.objects.exists()


def test_test_button_saves_and_sends(page, alice_mail, webhook):
    response = page.post(URL, {"email": "on", "webhook_url": webhook.url, "events": ["failed"],
                               "long_wait_minutes": "60", "action": "test"}, follow=True)

    html = response.content.decode()
    assert "Email: test message sent to alice@example.org." in html
    assert "Webhook: test message sent to the webhook." in html
    assert mail.outbox[0].subject == "Colony: test message"
    assert len(webhook.received) == 1


def test_recent_messages_say_what_happened(page, alice_mail, charlie):
    job = JobFactory(owner=alice_mail, name="bert")
    Notification.objects.create(user=alice_mail, job=job, event="failed", channel="webhook", dedupe_key="a",
                                state=Notification.State.FAILED, attempts=5, last_error="The webhook answered 500: x")
    Notification.objects.create(user=charlie, job=JobFactory(owner=charlie, name="secret-llm"), event="succeeded",
                                channel="email", dedupe_key="c")

    html = page.get(URL).content.decode()

    assert "bert" in html and "Gave up after 5 tries" in html and "The webhook answered 500" in html
    assert "secret-llm" not in html  # another user's messages never show


def test_recent_messages_name_events_in_words_not_stored_keys(page, alice_mail):
    job = JobFactory(owner=alice_mail)
    for event in ("chain_cancelled", "idle_demoted", "long_wait", "timeout"):
        Notification.objects.create(user=alice_mail, job=job, event=event, channel="email",
                                    dedupe_key=f"{job.pk}:{event}")

    html = page.get(URL).content.decode()
    table = html[html.index('id="recent-notifications"'):]

    for words in ("ended; the jobs after it cancelled", "idle GPUs: made opportunistic", "long wait", "timed out"):
        assert f"<td>{words}</td>" in table
    assert "chain_cancelled" not in table and "idle_demoted" not in table
