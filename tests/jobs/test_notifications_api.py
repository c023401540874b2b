"""/api/v1/me/notifications/: each user reads and changes their own notification settings, and
nobody else's, whatever they send."""

from __future__ import annotations

import pytest

from jobs.models import NotificationSettings
from tests.jobs.notification_helpers import webhook  # noqa: F401 (fixture)

URL = "/api/v1/me/notifications/"


@pytest.fixture
def alice_mail(alice):
    alice.email = "alice@example.org"
    alice.save(update_fields=["email"])
    return alice


def test_defaults_until_saved_and_nothing_stored(api, alice_mail):
    response = api(alice_mail).get(URL)
    assert response.status_code == 200
    assert response.json() == {"email": False, "email_address": "alice@example.org", "webhook_url": "",
                               "events": [], "long_wait_minutes": 60}
    assert not NotificationSettings.objects.exists()


def test_put_saves_and_get_reads_back(api, alice_mail, webhook):
    body = {"email": True, "webhook_url": webhook.url, "events": ["long_wait", "failed", "failed"],
            "long_wait_minutes": 90}
    assert api(alice_mail).put(URL, body, format="json").status_code == 200

    saved = api(alice_mail).get(URL).json()
    assert saved["events"] == ["failed", "long_wait"]  # deduplicated, in a fixed order
    assert (saved["email"], saved["webhook_url"], saved["long_wait_minutes"]) == (True, webhook.url, 90)


def test_each_user_sees_and_changes_only_their_own(api, alice_mail, bob, charlie):
    api(alice_mail).put(URL, {"email": True, "events": ["failed"]}, format="json")

    for other in (bob, charlie):  # teammate and outsider alike
        assert api(other).get(URL).json()["events"] == []
        response = api(other).put(URL, {"events": ["succeeded"], "user": alice_mail.pk}, format="json")
        assert response.status_code == 200
    alice_settings = NotificationSettings.objects.get(user=alice_mail)
    assert (alice_settings.email, alice_settings.events) == (True, ["failed"])
    assert set(NotificationSettings.objects.values_list("user__username", flat=True)) == {"alice", "bob", "charlie"}


def test_anonymous_is_refused(api, alice_mail):
    assert api().get(URL).status_code in (401, 403)
    assert api().put(URL, {"events": ["failed"]}, format="json").status_code in (401, 403)


@pytest.mark.parametrize("body, field, words", [
    ({"webhook_url": "http://169.254.169.254/latest/meta-data/"}, "webhook_url", "internal address"),
    ({"webhook_url": "http://10.0.0.5:6379/"}, "webhook_url", "internal address"),
    ({"webhook_url": "ftp://example.org/"}, "webhook_url", "Use an http:// or https:// URL"),
    ({"events": ["exploded"]}, "events", "not a valid choice"),
    ({"long_wait_minutes": 0}, "long_wait_minutes", "greater than or equal to 1"),
])
def test_bad_settings_are_refused_naming_the_field(api, alice_mail, settings, body, field, words):
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = []
    response = api(alice_mail).put(URL, {"events": ["failed"], **body}, format="json")
    assert response.status_code == 400
    assert words in str(response.json()["error"]["fields"][field])
    assert not NotificationSettings.objects.exists()


def test_email_needs_an_address(api, alice):
    response = api(alice).put(URL, {"email": True}, format="json")
    assert response.status_code == 400
    assert "no email address" in response.json()["error"]["fields"]["email"][0]


def test_send_a_test_message(api, alice_mail, webhook):
    api(alice_mail).put(URL, {"webhook_url": webhook.url}, format="json")

    response = api(alice_mail).post(f"{URL}test/")

    assert response.json() == {"results": [{"ok": True, "message": "Webhook: test message sent to the webhook."}]}
    assert webhook.received[0]["text"].startswith("Colony: test message")
    assert api(alice_mail).post(f"{URL}test/").status_code == 429  # not a way to hammer a URL
