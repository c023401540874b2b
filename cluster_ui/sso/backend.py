"""The OpenID Connect authentication backend: mozilla-django-oidc's code flow, held to the checks
it leaves out, and accounts keyed by the provider's subject with their tenants from its groups."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from agents.protocol import POSIX_NAME_RE
from cluster_ui.sso.group_map import claim_groups
from cluster_ui.sso.models import OidcIdentity
from cluster_ui.sso.sync import bring_in_line, granted_tenants

_NOT_IN_USERNAME = re.compile(r"[^\w.@+-]")
_POSIX_NAME = re.compile(POSIX_NAME_RE)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NoTenant:
    """Why a good sign-in still let nobody in: none of the user's groups grants a tenant that exists."""

    who: str
    groups: tuple[str, ...]


class OIDCBackend(OIDCAuthenticationBackend):
    def __init__(self, *args, **kwargs):
        # Listed in AUTHENTICATION_BACKENDS always (so a session it began stays valid); with single
        # sign-on off it reads none of the OIDC settings, which are then empty.
        self.enabled = settings.COLONY_OIDC_ENABLED
        if self.enabled:
            super().__init__(*args, **kwargs)
        else:
            self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        # Only the callback view asks with a nonce; a password form (whatever its query string)
        # never reaches the token endpoint.
        if not self.enabled or "nonce" not in kwargs or "password" in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    # ------------------------------------------------------------ the ID token
    def verify_token(self, token, **kwargs):
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token is not a JWT: {exc}") from None
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            # Also refuses "none": an unsigned token never gets as far as its claims.
            raise SuspiciousOperation(f"ID token signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}")
        try:
            return super().verify_token(token, **kwargs)  # signature, then the nonce
        except jwt.PyJWTError as exc:  # e.g. a published key PyJWT cannot use for this algorithm
            raise SuspiciousOperation(f"ID token refused: {exc}") from None

    def retrieve_matching_jwk(self, token):
        if "kid" in jwt.get_unverified_header(token):
            return super().retrieve_matching_jwk(token)
        # No kid: allowed only while the provider publishes one signing key (OpenID Connect Core 10.1).
        response = requests.get(self.OIDC_OP_JWKS_ENDPOINT, verify=self.get_settings("OIDC_VERIFY_SSL", True),
                                timeout=self.get_settings("OIDC_TIMEOUT", None))
        response.raise_for_status()
        keys = [key for key in response.json().get("keys", []) if key.get("use", "sig") == "sig"]
        if len(keys) != 1:
            raise SuspiciousOperation(f"ID token names no signing key (kid) and the provider publishes {len(keys)}")
        return jwt.PyJWK(keys[0])

    def get_payload_data(self, token, key):
        """The claims, once the signature, issuer, audience and lifetime hold (the library checks
        only the signature and expiry)."""
        try:
            payload = jwt.decode(
                token, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.COLONY_OIDC_ISSUER, leeway=settings.COLONY_OIDC_LEEWAY_S,
                options={"require": ["iss", "aud", "sub", "exp", "iat"]},
            )
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        # With several audiences the token must have been issued to us (OpenID Connect Core 3.1.3.7).
        if isinstance(payload["aud"], list) and len(payload["aud"]) > 1 \
                and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token has several audiences and was not issued to this client (azp)")
        return payload

    # ------------------------------------------------------------ the account
    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload["sub"]:
            raise SuspiciousOperation("userinfo answers for another subject than the ID token")
        claims = {**payload, **userinfo}
        groups = claim_groups(claims, settings.COLONY_OIDC_GROUPS_CLAIM)
        grants = settings.COLONY_OIDC_GROUP_MAP.resolve(groups)
        with transaction.atomic():
            identity = (OidcIdentity.objects.select_for_update().select_related("user")
                        .filter(issuer=payload["iss"], subject=payload["sub"]).first())
            tenants = granted_tenants(grants)
            if not tenants and not grants.operator:
                if identity is not None:  # groups taken away at the IdP: so are the tenants
                    bring_in_line(identity.user, grants, tenants)
                    self._record(identity, groups)
                self.request.sso_refusal = NoTenant(who=_display_name(claims), groups=tuple(groups))
                return None
            if identity is None:
                identity = OidcIdentity(user=self._new_user(claims), issuer=payload["iss"], subject=payload["sub"])
            user = identity.user
            self._update_profile(user, claims)
            bring_in_line(user, grants, tenants)
            identity.posix_name = _posix_name(claims, identity.posix_name)
            self._record(identity, groups)
        return user

    def _new_user(self, claims):
        base = _NOT_IN_USERNAME.sub("-", str(claims.get("preferred_username") or claims.get("email") or claims["sub"]))
        base = base[:140] or "user"
        username, n = base, 1
        while self.UserModel.objects.filter(username=username).exists():  # a local account keeps its name
            n += 1
            username = f"{base}-{n}"
        user = self.UserModel(username=username)
        user.set_unusable_password()  # signs in at the provider only
        user.save()
        return user

    def _update_profile(self, user, claims):
        fields = {"email": claims.get("email") or "", "first_name": (claims.get("given_name") or "")[:150],
                  "last_name": (claims.get("family_name") or "")[:150]}
        changed = [name for name, value in fields.items() if isinstance(value, str) and getattr(user, name) != value]
        for name in changed:
            setattr(user, name, fields[name])
        if changed:
            user.save(update_fields=changed)

    @staticmethod
    def _record(identity, groups):
        identity.groups = list(groups)
        identity.last_login_at = timezone.now()
        identity.save()


def _posix_name(claims, current: str) -> str:
    """The user's POSIX account name from ``COLONY_OIDC_POSIX_CLAIM`` (blank when not configured or
    not sent). A value that is no POSIX name (a number, a space, 40 characters) is refused with a
    log line and the name stays as it was: a job must never run as some other account by accident."""
    claim = settings.COLONY_OIDC_POSIX_CLAIM
    if not claim:
        return ""
    value = claims.get(claim)
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _POSIX_NAME.match(value):
        log.warning("sso: claim %s of %s is %r, not a POSIX account name; ignored", claim, _display_name(claims), value)
        return current
    return value


def _display_name(claims) -> str:
    return str(claims.get("preferred_username") or claims.get("email") or claims.get("name") or claims["sub"])
