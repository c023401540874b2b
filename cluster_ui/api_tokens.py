"""API tokens that expire and can be revoked (:class:`cluster_ui.models.ApiToken`), and the
authentication that checks them on every request.

- :func:`issue` makes one: ``COLONY_API_TOKEN_DAYS`` (90) unless its maker asks for fewer or more
  days, never more than ``COLONY_API_TOKEN_MAX_DAYS`` (365). The key is returned once; only its
  SHA-256 is kept.
- :func:`revoke`: by its owner, or by an operator for anyone's. It is refused from the next
  request on: :class:`ExpiringTokenAuthentication` reads the row every time (no cache).
- An expired or revoked token is answered 401 with what happened and when, not DRF's bare
  "Invalid token.", so a script's owner knows to make a new one.
- Tokens made before this model (DRF's one ``authtoken`` key per user) still authenticate until
  ``COLONY_API_TOKEN_DAYS`` after they were made, then are refused as expired: none lives forever.

Every token made or revoked is written to the audit log (:mod:`cluster_ui.audit`).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from cluster_ui import audit
from cluster_ui.models import ApiToken

# last_used_at is written at most this often per token: not one UPDATE per API request.
LAST_USED_EVERY = timedelta(minutes=5)


def default_days() -> int:
    return settings.COLONY_API_TOKEN_DAYS


def max_days() -> int:
    return settings.COLONY_API_TOKEN_MAX_DAYS


class TooLong(ValueError):
    """Asked for a token that would outlive ``COLONY_API_TOKEN_MAX_DAYS``."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue(user, name: str = "", days: int | None = None, *, by=None) -> tuple[ApiToken, str]:
    """A new token of ``user`` valid ``days`` days (the default when None); returns it and its key."""
    days = default_days() if days is None else int(days)
    if days < 1 or days > max_days():
        raise TooLong(f"A token lasts 1 to {max_days()} days (COLONY_API_TOKEN_MAX_DAYS); {days} was asked.")
    key = secrets.token_hex(20)
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name[:100], digest=digest(key), ending=key[-4:],
                                        expires_at=timezone.now() + timedelta(days=days))
        audit.record(by or user, "token.create", token, owner=user.get_username(), name=token.name,
                     expires_at=token.expires_at.isoformat())
    return token, key


def revoke(token: ApiToken, by) -> bool:
    """End ``token`` now; False when it had ended already."""
    with transaction.atomic():
        if not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
                revoked_at=timezone.now(), revoked_by=by):
            return False
        audit.record(by, "token.revoke", token, owner=token.user.get_username(), name=token.name)
    token.refresh_from_db()
    return True


def is_operator(user) -> bool:
    """(The rule is the jobs app's; the API base in cluster_ui/api/ imports no app, so it asks here.)"""
    # Late: DRF imports this module (settings name its authentication class) whenever it loads
    # its views, the API base's included, which must not load the jobs app with it.
    from jobs.services.notifications import is_operator as operator

    return operator(user)


def may_manage(user, token: ApiToken) -> bool:
    """Its owner, or an operator."""
    return token.user_id == user.pk or is_operator(user)


def _when(at) -> str:
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M %Z}"


class ExpiringTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>`` against :class:`ApiToken` (then legacy DRF tokens), refusing
    expired and revoked ones with a message that says so (401)."""

    def authenticate_credentials(self, key):
        token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
        now = timezone.now()
        if token is not None:
            if token.revoked_at is not None:
                raise AuthenticationFailed(f"This API token was revoked on {_when(token.revoked_at)}; "
                                           "create a new one under Account > API tokens.")
            if token.expires_at <= now:
                raise AuthenticationFailed(f"This API token expired on {_when(token.expires_at)}; "
                                           "create a new one under Account > API tokens.")
            if not token.user.is_active:
                raise AuthenticationFailed("User inactive or deleted.")
            if token.last_used_at is None or now - token.last_used_at > LAST_USED_EVERY:
                ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            return token.user, token
        legacy = Token.objects.select_related("user").filter(key=key).first()
        if legacy is None:
            raise AuthenticationFailed("Invalid token.")
        ends = legacy.created + timedelta(days=default_days())
        if ends <= now:
            raise AuthenticationFailed(f"This API token expired on {_when(ends)}; "
                                       "create a new one under Account > API tokens.")
        if not legacy.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return legacy.user, legacy
