"""The submit page's ``colony submit`` line follows the form as a researcher fills it in, the
environment variables, stop signal and preemption notice included (what the CLI takes as
``--env``, ``--stop-signal`` and ``--grace``)."""

from __future__ import annotations


import pytest

from tests.browser.conftest import VIEWPORT
from tests.browser.sign_in import sign_in
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def test_the_command_line_preview_names_env_signal_and_notice(transactional_db, browser, live_server,
                                                              monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's steps
    MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision"))
    page = browser.new_context(viewport=VIEWPORT).new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url)

    page.goto(f"{live_server.url}/jobs/submit/")
    page.fill("#id_command", "python train.py --epochs 3")
    page.fill("#id_env", "EPOCHS=3\nOPTS=--lr=3e-4 -v\n")
    page.select_option("#id_stop_signal", "SIGUSR1")
    page.fill("#id_preempt_grace", "2m")
    preview = page.locator("#cli-equivalent").inner_text()
    assert preview == ("colony submit --gpus 1 --env EPOCHS=3 --env 'OPTS=--lr=3e-4 -v' --grace 2m "
                       "--stop-signal SIGUSR1 -- python train.py --epochs 3")
    page.select_option("#id_stop_signal", "SIGTERM")  # the default goes unsaid, as the CLI's
    assert "--stop-signal" not in page.locator("#cli-equivalent").inner_text()
    assert errors == []
