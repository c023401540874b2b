"""``manage.py oidc_discover ISSUER``: the COLONY_OIDC_* endpoint lines for an identity provider,
read from its discovery document, and the redirect URI to register with it."""

from __future__ import annotations

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

ENDPOINTS = {
    "COLONY_OIDC_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "COLONY_OIDC_TOKEN_ENDPOINT": "token_endpoint",
    "COLONY_OIDC_USERINFO_ENDPOINT": "userinfo_endpoint",
    "COLONY_OIDC_JWKS_ENDPOINT": "jwks_uri",
}


class Command(BaseCommand):
    help = "Print the COLONY_OIDC_* settings for an OpenID provider from its discovery document."

    def add_arguments(self, parser):
        parser.add_argument("issuer", help="the provider's issuer URL, e.g. https://idp.example.org/realms/lab")

    def handle(self, *args, issuer, **options):
        url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
        try:
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            config = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise CommandError(f"could not read {url}: {exc}") from None
        if config.get("issuer") != issuer:
            # Tokens carry the document's issuer; a mismatch would refuse every sign-in later.
            raise CommandError(f"{url} names the issuer {config.get('issuer')!r}, not {issuer!r}: "
                               "pass exactly that (trailing slash included)")
        missing = [key for key in ENDPOINTS.values() if not config.get(key)]
        if missing:
            raise CommandError(f"{url} lacks {', '.join(missing)}")
        self.stdout.write(f"COLONY_OIDC_ISSUER={issuer}")
        for name, key in ENDPOINTS.items():
            self.stdout.write(f"{name}={config[key]}")
        algs = config.get("id_token_signing_alg_values_supported") or []
        if algs and settings.OIDC_RP_SIGN_ALGO not in algs:
            self.stdout.write(f"COLONY_OIDC_SIGN_ALGO={algs[0]}")
        self.stderr.write("Register this redirect URI with the provider: "
                          f"{settings.COLONY_PUBLIC_URL}/sso/oidc/callback/")
