"""The Notifications page in a real browser: a researcher finds it in the menu, ticks "failed",
saves, and finds the box still ticked (saved as var/screenshots/notifications.png)."""

from __future__ import annotations

import re

import pytest

from jobs.models import NotificationSettings
from tests.browser.conftest import VIEWPORT
from tests.browser.sign_in import sign_in
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def test_researcher_opts_in_to_failure_mail(transactional_db, live_server, browser, screenshot, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    alice = MembershipFactory(user=UserFactory(username="alice", email="alice@example.org"),
                              tenant=TenantFactory(slug="vision")).user

    page = browser.new_context(viewport=VIEWPORT).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url)

    page.click("nav >> text=Notifications")
    page.wait_for_url(re.compile(r"/jobs/notifications/$"))
    page.check("#id_email")
    page.check("input[name=events][value=failed]")
    page.fill("#id_long_wait_minutes", "45")
    page.click("button[value=save]")

    page.wait_for_selector(".flash-success")
    assert "Notification settings saved." in page.inner_text(".flash")
    assert page.is_checked("input[name=events][value=failed]")
    assert not page.is_checked("input[name=events][value=succeeded]")
    assert page.is_checked("#id_email")
    assert page.input_value("#id_long_wait_minutes") == "45"
    saved = NotificationSettings.objects.get(user=alice)
    assert (saved.email, saved.events, saved.long_wait_minutes) == (True, ["failed"], 45)
    screenshot(page, "notifications")
    assert errors == []
