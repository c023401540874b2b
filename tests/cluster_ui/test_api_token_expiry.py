"""API tokens expire and can be revoked (issue 38), through the API with real token headers:
made with an expiry (default, chosen, bounded), refused once expired or revoked with a 401 that
says so, listed and revoked by their owner (API and page), revoked by an operator for anyone,
and not touched by anyone else."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cluster_ui.models import ApiToken

QUEUE = "/api/v1/jobs/"


def with_token(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def make(api, user, **body):
    response = api(user).post("/api/v1/auth/tokens/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_new_token_works_and_lasts_the_default_unless_asked(api, alice, settings):
    settings.COLONY_API_TOKEN_DAYS = 90
    made = make(api, alice, name="laptop")
    assert with_token(made["key"]).get(QUEUE).status_code == 200
    lasts = ApiToken.objects.get(pk=made["id"]).expires_at - timezone.now()
    assert timedelta(days=89) < lasts <= timedelta(days=90)
    shorter = make(api, alice, name="ci", expires_in_days=7)
    assert timezone.now() + timedelta(days=6) < ApiToken.objects.get(pk=shorter["id"]).expires_at


def test_a_token_longer_than_the_maximum_is_refused(api, alice, settings):
    settings.COLONY_API_TOKEN_MAX_DAYS = 30
    response = api(alice).post("/api/v1/auth/tokens/", {"expires_in_days": 31}, format="json")
    assert response.status_code == 400
    assert "expires_in_days" in response.json()["error"]["fields"]
    assert not ApiToken.objects.exists()


def test_an_expired_token_is_refused_with_a_clear_401(api, alice):
    made = make(api, alice)
    ApiToken.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(minutes=1))
    response = with_token(made["key"]).get(QUEUE)
    assert response.status_code == 401
    assert "expired on" in response.json()["error"]["message"]


def test_login_with_a_password_gives_an_expiring_token(client, alice):
    response = client.post("/api/v1/auth/token/", {"username": "alice", "password": "correct-horse-battery"})
    key = response.json()["token"]
    assert ApiToken.objects.get(user=alice).expires_at > timezone.now()
    assert with_token(key).get(QUEUE).status_code == 200


def test_an_owner_lists_and_revokes_a_token_and_it_stops_at_once(api, alice):
    made = make(api, alice, name="laptop")
    client = with_token(made["key"])
    assert client.get(QUEUE).status_code == 200
    listed = api(alice).get("/api/v1/auth/tokens/").json()
    assert [(t["id"], t["name"], t["active"]) for t in listed] == [(made["id"], "laptop", True)]
    assert "key" not in listed[0] and made["key"] not in str(listed)

    assert api(alice).delete(f"/api/v1/auth/tokens/{made['id']}/").status_code == 200
    response = client.get(QUEUE)
    assert response.status_code == 401 and "revoked on" in response.json()["error"]["message"]


def test_only_the_owner_or_an_operator_may_see_or_revoke_a_token(api, alice, bob, charlie, operator):
    made = make(api, alice)
    for other in (bob, charlie):  # a teammate and an outsider: not said to exist
        assert api(other).delete(f"/api/v1/auth/tokens/{made['id']}/").status_code == 404
        assert api(other).get("/api/v1/auth/tokens/?all=1").json() == []
    assert with_token(made["key"]).get(QUEUE).status_code == 200

    everyone = api(operator).get("/api/v1/auth/tokens/?all=1").json()
    assert [(t["id"], t["user"]) for t in everyone] == [(made["id"], "alice")]
    assert api(operator).delete(f"/api/v1/auth/tokens/{made['id']}/").json()["revoked_by"] == "operator"
    assert with_token(made["key"]).get(QUEUE).status_code == 401


def test_a_token_made_before_expiry_existed_expires_after_the_default(alice, settings):
    settings.COLONY_API_TOKEN_DAYS = 90
    legacy = Token.objects.create(user=alice)
    assert with_token(legacy.key).get(QUEUE).status_code == 200
    Token.objects.filter(pk=legacy.pk).update(created=timezone.now() - timedelta(days=91))
    response = with_token(legacy.key).get(QUEUE)
    assert response.status_code == 401 and "expired on" in response.json()["error"]["message"]


def test_the_page_makes_lists_and_revokes_tokens(alice, web):
    client = web(alice)
    assert "No token yet" in client.get("/account/tokens/").content.decode()
    page = client.post("/account/tokens/", {"action": "create", "name": "laptop", "days": "30"}).content.decode()
    token = ApiToken.objects.get(user=alice)
    key = page.split('id="new-token">')[1].split("<")[0]
    assert token.ending == key[-4:] and with_token(key).get(QUEUE).status_code == 200
    later = client.get("/account/tokens/").content.decode()
    assert key not in later and "laptop" in later and "active" in later
    client.post("/account/tokens/", {"action": "revoke", "token": token.pk})
    assert with_token(key).get(QUEUE).status_code == 401
    assert "revoked" in client.get("/account/tokens/").content.decode()


@pytest.mark.parametrize("days", ["0", "9999"])
def test_the_page_refuses_a_lifetime_out_of_bounds(alice, web, days):
    web(alice).post("/account/tokens/", {"action": "create", "days": days})
    assert not ApiToken.objects.exists()
