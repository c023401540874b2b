"""Single sign-on in a real browser: the login page's "Sign in with ..." button, the person signs
in at a real OpenID provider on loopback (tests/cluster_ui/sso/provider.py), and lands on the queue of the
tenant their IdP group maps to; someone whose groups map to nothing sees why they are not in."""

from __future__ import annotations

import re

import pytest
from oidc_provider_mock import run_server_in_thread

from tests.browser.conftest import VIEWPORT
from tests.factories import JobFactory, TenantFactory, UserFactory
from tests.cluster_ui.sso.provider import CALLBACK_PATH, PROVIDER_NAME, Provider, configure

pytestmark = pytest.mark.e2e


@pytest.fixture
def provider():
    with run_server_in_thread(require_client_registration=True, require_nonce=True) as server:
        provider = Provider(server)
        yield provider
        provider.http.close()


def test_a_researcher_signs_in_with_the_organisation_and_sees_the_tenant_queue(
        transactional_db, live_server, browser, provider, settings, monkeypatch, screenshot):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's steps
    configure(settings, provider, provider.register(f"{live_server.url}{CALLBACK_PATH}"))
    vision, nlp = TenantFactory(slug="vision", name="Vision Lab"), TenantFactory(slug="nlp", name="NLP Group")
    owner = UserFactory(username="lab-bot")
    JobFactory(tenant=vision, owner=owner, name="vision-resnet-sweep")
    JobFactory(tenant=nlp, owner=owner, name="nlp-secret-finetune")
    provider.add_user("8f14e45f-alice", email="alice@example.org", preferred_username="alice",
                      groups=["vision-researchers", "all-staff"])
    provider.add_user("c9f0f895-carol", email="carol@example.org", preferred_username="carol", groups=["marketing"])

    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{live_server.url}/accounts/login/")
    assert page.locator("input[name=password]").is_visible()  # local accounts stay
    screenshot(page, "sso-login")
    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()

    page.wait_for_url(re.compile(re.escape(provider.issuer) + r"/oauth2/authorize"))
    page.fill("input[name=sub]", "8f14e45f-alice")
    page.get_by_role("button", name="Authorize").click()

    page.wait_for_url(f"{live_server.url}/jobs/")
    assert page.locator(".topbar .username").inner_text() == "alice"
    body = page.locator("main").inner_text()
    assert "vision-resnet-sweep" in body
    assert "nlp-secret-finetune" not in body
    screenshot(page, "sso-queue")

    # Someone whose groups map to no tenant is told so, and is not signed in.
    other = browser.new_context(viewport=VIEWPORT).new_page()
    other.goto(f"{live_server.url}/accounts/login/")
    other.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    other.fill("input[name=sub]", "c9f0f895-carol")
    other.get_by_role("button", name="Authorize").click()
    other.wait_for_url(re.compile(re.escape(live_server.url) + r"/sso/oidc/callback/"))
    assert "No Colony tenant for this account" in other.locator("main").inner_text()
    assert "marketing" in other.locator("main").inner_text()
    assert other.locator(".topbar .username").count() == 0
    screenshot(other, "sso-no-tenant")
    assert errors == []
