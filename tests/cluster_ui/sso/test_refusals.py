"""What Colony refuses from the provider's side of a sign-in: ID tokens that are unsigned, signed
by someone else, issued to another application or by another issuer, expired, or carrying another
nonce; callbacks with an unknown or replayed state. Each substitute token is a genuine one from a
real provider (or one forged the way an attacker would), put in the token endpoint's answer."""

from __future__ import annotations

from datetime import timedelta

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from oidc_provider_mock import run_server_in_thread

from cluster_ui.sso.models import OidcIdentity
from tests.factories import TenantFactory
from tests.cluster_ui.sso.flow import params, sign_in, signed_in_user, start
from tests.cluster_ui.sso.provider import CALLBACK_PATH, Provider, configure

pytestmark = pytest.mark.django_db
REDIRECT = f"http://testserver{CALLBACK_PATH}"


@pytest.fixture(autouse=True)
def alice(sso):
    TenantFactory(slug="vision")
    sso.add_user("sub-alice", email="alice@example.org", groups=["vision-researchers"])
    return "sub-alice"


def claims(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def assert_refused(response, client):
    assert response.status_code == 400, response
    assert "Sign-in refused" in response.content.decode()
    assert signed_in_user(client) is None
    assert not OidcIdentity.objects.exists()


def test_the_genuine_token_through_the_same_path_is_accepted(client, sso, token_swap, alice):
    """The control for the refusals below: the man in the middle, passing the token untouched."""
    token_swap.swap = lambda original: original
    assert sign_in(client, sso, alice).status_code == 302
    assert signed_in_user(client) is not None


def test_a_token_issued_to_another_application_is_refused(client, sso, token_swap, alice):
    other_app = sso.register("http://other.example/callback")
    token_swap.swap = lambda original: sso.id_token_for(other_app, "http://other.example/callback", alice,
                                                        nonce=claims(original)["nonce"])
    assert_refused(sign_in(client, sso, alice), client)


def test_a_token_with_another_nonce_is_refused(client, sso, colony_client, token_swap, alice):
    # Genuine, for Colony and this user, but from another sign-in (a replayed or injected one).
    token_swap.swap = lambda original: sso.id_token_for(colony_client, REDIRECT, alice, nonce="n" * 32)
    assert_refused(sign_in(client, sso, alice), client)


def test_a_token_signed_with_another_key_is_refused(client, sso, token_swap, alice):
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = sso.http.get("/jwks").json()["keys"][0]["kid"]  # claims to be the provider's key
    token_swap.swap = lambda original: jwt.encode(claims(original), forger, algorithm="RS256", headers={"kid": kid})
    assert_refused(sign_in(client, sso, alice), client)


def test_an_unsigned_token_is_refused(client, sso, token_swap, alice):
    token_swap.swap = lambda original: jwt.encode(claims(original), None, algorithm="none")
    assert_refused(sign_in(client, sso, alice), client)


def test_a_token_signed_with_the_client_secret_is_refused(client, sso, colony_client, token_swap, alice):
    # Algorithm confusion: HS256 keyed with a secret Colony knows is not the provider's signature.
    token_swap.swap = lambda original: jwt.encode(claims(original), colony_client.client_secret, algorithm="HS256")
    assert_refused(sign_in(client, sso, alice), client)


def test_a_token_from_another_provider_is_refused(client, sso, token_swap, alice):
    with run_server_in_thread(require_client_registration=True) as server:
        elsewhere = Provider(server)
        elsewhere.add_user(alice, email="alice@example.org", groups=["vision-researchers"])
        registered = elsewhere.register(REDIRECT)
        token_swap.swap = lambda original: elsewhere.id_token_for(registered, REDIRECT, alice,
                                                                  nonce=claims(original)["nonce"])
        assert_refused(sign_in(client, sso, alice), client)
        elsewhere.http.close()


def test_an_expired_token_is_refused(client, sso, settings, alice):
    # A provider whose tokens expired five minutes before they were issued (Colony allows 60 s of skew).
    with run_server_in_thread(require_client_registration=True, access_token_max_age=timedelta(minutes=-5)) as server:
        stale = Provider(server)
        stale.add_user(alice, email="alice@example.org", groups=["vision-researchers"])
        configure(settings, stale, stale.register(REDIRECT))
        assert claims_expired(stale, alice)
        assert_refused(sign_in(client, stale, alice), client)
        stale.http.close()


def claims_expired(provider, sub) -> bool:
    client = provider.register("http://probe.example/cb")
    token = provider.id_token_for(client, "http://probe.example/cb", sub, nonce="probe")
    return claims(token)["exp"] < claims(token)["iat"]


def test_tokens_from_another_issuer_than_configured_are_refused(client, sso, settings, alice):
    settings.COLONY_OIDC_ISSUER = f"{sso.issuer}/realms/elsewhere"
    assert_refused(sign_in(client, sso, alice), client)


def test_a_callback_with_an_unknown_state_is_refused(client, sso, alice):
    back = sso.log_in(start(client), alice)
    forged = back.replace(f"state={params(back)['state']}", "state=" + "x" * 32)
    assert_refused(client.get(forged), client)


def test_a_callback_used_twice_is_refused_the_second_time(client, sso, alice):
    back = sso.log_in(start(client), alice)
    assert client.get(back).status_code == 302
    client.logout()  # a new session for the replay, as a second browser would have
    response = client.get(back, follow=True)
    assert signed_in_user(client) is None
    assert "did not complete" in response.content.decode()


def test_a_callback_from_another_browser_is_refused(client, sso, alice):
    """Login CSRF: an attacker's own authorization response, opened in the victim's browser, which
    never started a sign-in, logs nobody in."""
    from django.test import Client

    attacker = Client()
    back = sso.log_in(start(attacker), alice)
    response = client.get(back, follow=True)
    assert signed_in_user(client) is None
    assert "did not complete" in response.content.decode()
