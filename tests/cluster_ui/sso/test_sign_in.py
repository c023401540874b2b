"""Signing in through a real OpenID provider: accounts, tenants and roles from the IdP's groups,
brought in line at every sign-in; local accounts keep working beside it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from cluster_ui.sso.models import OidcIdentity
from jobs.choices import Role
from jobs.models import Membership
from tests.factories import PASSWORD, JobFactory, MembershipFactory, TenantFactory, UserFactory
from tests.cluster_ui.sso.flow import params, sign_in, signed_in_user, start
from tests.cluster_ui.sso.provider import PROVIDER_NAME

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenants():
    return TenantFactory(slug="vision", name="Vision Lab"), TenantFactory(slug="nlp", name="NLP Group")


def roles_of(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))


def test_login_page_offers_the_provider_beside_the_local_form(client, sso):
    page = client.get("/accounts/login/?next=/jobs/").content.decode()
    assert f"Sign in with {PROVIDER_NAME}" in page
    assert 'href="/sso/oidc/authenticate/?next=/jobs/"' in page
    assert 'name="password"' in page  # the local form is still there


def test_without_configuration_there_is_no_sign_in_link_and_no_endpoint(client, settings):
    assert settings.COLONY_OIDC_ENABLED is False  # the test environment sets no COLONY_OIDC_*
    assert "Sign in with" not in client.get("/accounts/login/").content.decode()
    assert client.get("/sso/oidc/authenticate/").status_code == 404
    assert client.get("/sso/oidc/callback/?code=x&state=y").status_code == 404


def test_the_request_carries_state_nonce_and_pkce(client, sso, colony_client):
    sent = params(start(client))
    assert sent["client_id"] == colony_client.client_id
    assert sent["redirect_uri"] == "http://testserver/sso/oidc/callback/"
    assert len(sent["state"]) >= 32 and len(sent["nonce"]) >= 32
    assert sent["code_challenge_method"] == "S256"


def test_first_sign_in_makes_an_account_in_the_mapped_tenant(client, sso, tenants):
    vision, nlp = tenants
    JobFactory(tenant=vision, name="vision-train")
    JobFactory(tenant=nlp, name="nlp-secret")
    sso.add_user("sub-alice", email="alice@example.org", preferred_username="alice", given_name="Alice",
                 groups=["vision-researchers", "unrelated-mailing-list"])

    response = sign_in(client, sso, "sub-alice")

    assert response.status_code == 302 and response["Location"] == "/jobs/"
    alice = signed_in_user(client)
    assert (alice.username, alice.email, alice.first_name) == ("alice", "alice@example.org", "Alice")
    assert not alice.has_usable_password() and not alice.is_staff
    assert roles_of(alice) == {"vision": Role.RESEARCHER}
    identity = OidcIdentity.objects.get(user=alice)
    assert (identity.issuer, identity.subject) == (sso.issuer, "sub-alice")
    assert identity.groups == ["vision-researchers", "unrelated-mailing-list"]
    queue = client.get("/jobs/").content.decode()
    assert "vision-train" in queue and "nlp-secret" not in queue


def test_every_sign_in_brings_tenants_roles_and_staff_in_line_with_the_groups(client, sso, tenants):
    sso.add_user("sub-bob", email="bob@example.org", preferred_username="bob",
                 groups=["vision-researchers", "vision-leads", "nlp-researchers"])
    sign_in(client, sso, "sub-bob")
    bob = signed_in_user(client)
    assert roles_of(bob) == {"vision": Role.LEAD, "nlp": Role.RESEARCHER}  # the stronger role wins

    client.logout()
    sso.add_user("sub-bob", email="bob@example.org", preferred_username="bob", groups=["nlp-researchers", "hpc-admins"])
    sign_in(client, sso, "sub-bob")
    bob.refresh_from_db()
    assert signed_in_user(client) == bob  # the same account: known by its subject
    assert roles_of(bob) == {"nlp": Role.RESEARCHER}
    assert bob.is_staff and not bob.is_superuser

    client.logout()
    sso.add_user("sub-bob", email="bob@example.org", preferred_username="bob", groups=["vision-leads"])
    sign_in(client, sso, "sub-bob")
    bob.refresh_from_db()
    assert roles_of(bob) == {"vision": Role.LEAD}
    assert not bob.is_staff


def test_an_operator_group_alone_signs_in_to_see_every_tenant(client, sso, tenants):
    JobFactory(tenant=tenants[0], name="vision-train")
    JobFactory(tenant=tenants[1], name="nlp-train")
    sso.add_user("sub-olga", email="olga@example.org", groups=["hpc-admins"])

    assert sign_in(client, sso, "sub-olga")["Location"] == "/jobs/"
    olga = signed_in_user(client)
    assert olga.is_staff and roles_of(olga) == {}
    queue = client.get("/jobs/").content.decode()
    assert "vision-train" in queue and "nlp-train" in queue


def test_no_mapped_group_gets_no_tenant_and_a_page_saying_so(client, sso, tenants):
    sso.add_user("sub-carol", email="carol@example.org", preferred_username="carol", groups=["marketing"])

    response = sign_in(client, sso, "sub-carol")

    assert response.status_code == 403
    page = response.content.decode()
    assert "No Colony tenant for this account" in page
    assert "carol" in page and "<code>marketing</code>" in page
    assert signed_in_user(client) is None
    assert not get_user_model().objects.filter(email="carol@example.org").exists()


def test_groups_taken_away_at_the_idp_take_the_tenants_away(client, sso, tenants):
    sso.add_user("sub-dan", email="dan@example.org", groups=["vision-leads", "hpc-admins"])
    sign_in(client, sso, "sub-dan")
    dan = signed_in_user(client)
    client.logout()

    sso.add_user("sub-dan", email="dan@example.org", groups=[])
    response = sign_in(client, sso, "sub-dan")

    assert response.status_code == 403 and "sent no groups for you" in response.content.decode()
    assert signed_in_user(client) is None
    dan.refresh_from_db()
    assert roles_of(dan) == {} and not dan.is_staff
    assert OidcIdentity.objects.get(user=dan).groups == []


def test_a_group_mapped_to_a_tenant_that_does_not_exist_grants_nothing(client, sso, tenants):
    sso.add_user("sub-erin", email="erin@example.org", groups=["ghost-team"])
    assert sign_in(client, sso, "sub-erin").status_code == 403
    assert signed_in_user(client) is None


def test_local_accounts_stay_and_are_never_taken_over_by_name_or_email(client, sso, tenants):
    vision, nlp = tenants
    local = MembershipFactory(user=UserFactory(username="alice", email="alice@example.org"), tenant=nlp).user
    sso.add_user("sub-alice", email="alice@example.org", preferred_username="alice", groups=["vision-researchers"])

    sign_in(client, sso, "sub-alice")

    sso_alice = signed_in_user(client)
    assert sso_alice != local and sso_alice.username == "alice-2"
    assert roles_of(local) == {"nlp": Role.RESEARCHER}  # the local account's tenants are its own
    client.logout()
    response = client.post("/accounts/login/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302 and signed_in_user(client) == local


def test_cancelling_at_the_provider_returns_to_the_login_page_with_a_message(client, sso):
    back = sso.deny(start(client))
    response = client.get(back, follow=True)
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    assert f"Sign-in with {PROVIDER_NAME} was cancelled (access_denied)" in response.content.decode()
    assert signed_in_user(client) is None


def test_a_disabled_account_stays_out(client, sso, tenants):
    sso.add_user("sub-fay", email="fay@example.org", groups=["vision-researchers"])
    sign_in(client, sso, "sub-fay")
    fay = signed_in_user(client)
    client.logout()
    fay.is_active = False
    fay.save()

    response = client.get(sso.log_in(start(client), "sub-fay"), follow=True)

    assert "This Colony account is disabled" in response.content.decode()
    assert signed_in_user(client) is None


def test_next_goes_back_into_colony_but_never_to_another_site(client, sso, tenants):
    sso.add_user("sub-gus", email="gus@example.org", groups=["vision-researchers"])
    assert sign_in(client, sso, "sub-gus", next_url="/jobs/?state=PENDING")["Location"] == "/jobs/?state=PENDING"
    client.logout()
    assert sign_in(client, sso, "sub-gus", next_url="https://evil.example/phish")["Location"] == "/jobs/"
