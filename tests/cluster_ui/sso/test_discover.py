"""``manage.py oidc_discover``: an operator's COLONY_OIDC_* lines read from a real provider's
discovery document."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command


def test_prints_the_endpoint_settings_of_the_provider(provider, settings):
    settings.COLONY_PUBLIC_URL = "https://colony.example.org"
    out, err = StringIO(), StringIO()
    call_command("oidc_discover", provider.issuer, stdout=out, stderr=err)
    lines = dict(line.split("=", 1) for line in out.getvalue().splitlines())
    assert lines == {
        "COLONY_OIDC_ISSUER": provider.issuer,
        "COLONY_OIDC_AUTHORIZATION_ENDPOINT": f"{provider.issuer}/oauth2/authorize",
        "COLONY_OIDC_TOKEN_ENDPOINT": f"{provider.issuer}/oauth2/token",
        "COLONY_OIDC_USERINFO_ENDPOINT": f"{provider.issuer}/userinfo",
        "COLONY_OIDC_JWKS_ENDPOINT": f"{provider.issuer}/jwks",
    }
    assert "https://colony.example.org/sso/oidc/callback/" in err.getvalue()


def test_an_issuer_spelled_otherwise_than_the_provider_does_is_refused(provider):
    with pytest.raises(CommandError, match="names the issuer"):
        call_command("oidc_discover", provider.issuer + "/", stdout=StringIO(), stderr=StringIO())


def test_no_provider_there(provider):
    with pytest.raises(CommandError, match="could not read"):
        call_command("oidc_discover", provider.issuer + "/nothing-here", stdout=StringIO(), stderr=StringIO())
