"""Driving a sign-in through Colony's real entry points with the Django test client, the person's
part at the provider done over HTTP."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

SIGN_IN_PATH = "/sso/oidc/authenticate/"


def start(client, next_url: str = "/jobs/") -> str:
    """Press "Sign in with ...": the provider's authorization URL Colony sends the browser to."""
    response = client.get(SIGN_IN_PATH, {"next": next_url})
    assert response.status_code == 302, response
    return response["Location"]


def sign_in(client, provider, sub: str, next_url: str = "/jobs/"):
    """The whole round trip; Colony's answer to the provider's redirect back."""
    back = provider.log_in(start(client, next_url), sub)
    return client.get(back)


def params(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def signed_in_user(client):
    from django.contrib.auth import get_user_model

    user_id = client.session.get("_auth_user_id")
    return get_user_model().objects.get(pk=user_id) if user_id else None
