"""The two ends of the OpenID Connect code flow (mozilla-django-oidc's views), answering 404 while
single sign-on is off and in words when a sign-in is refused."""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import redirect, render
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

log = logging.getLogger(__name__)


class _OnlyWhenEnabled:
    def dispatch(self, request, *args, **kwargs):
        if not settings.COLONY_OIDC_ENABLED:
            raise Http404("Single sign-on is not configured")
        return super().dispatch(request, *args, **kwargs)


class SignInView(_OnlyWhenEnabled, OIDCAuthenticationRequestView):
    """Sends the browser to the provider with a fresh state, nonce and PKCE challenge."""

    def __init__(self, *args, **kwargs):
        if settings.COLONY_OIDC_ENABLED:  # the library reads its endpoints here
            super().__init__(*args, **kwargs)


class CallbackView(_OnlyWhenEnabled, OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: the code is exchanged and the account brought in line."""

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            # Unknown state (a forged or replayed callback), a token that is not signed by the
            # provider, for another client, from another issuer, or with another nonce.
            log.warning("sso: sign-in refused: %s", exc)
            return self._page("sso/refused.html", status=400, reason=str(exc))
        except requests.RequestException as exc:
            log.warning("sso: the provider did not complete the sign-in: %s", exc)
            return self._page("sso/refused.html", status=502,
                              reason="the identity provider refused or did not answer the code exchange")

    def login_failure(self):
        refusal = getattr(self.request, "sso_refusal", None)
        if refusal is not None:
            return self._page("sso/no_tenant.html", status=403, refusal=refusal)
        user = getattr(self, "user", None)
        if user is not None and not user.is_active:
            messages.error(self.request, "This Colony account is disabled; ask an operator.")
        elif self.request.GET.get("error"):
            messages.error(self.request, f"Sign-in with {settings.COLONY_OIDC_PROVIDER_NAME} was cancelled "
                                         f"({self.request.GET['error']}).")
        else:
            messages.error(self.request, f"Sign-in with {settings.COLONY_OIDC_PROVIDER_NAME} did not complete; "
                                         "try again, or ask an operator if it keeps failing.")
        return redirect(settings.LOGIN_URL)

    def _page(self, template, status, **context):
        return render(self.request, template, {"provider_name": settings.COLONY_OIDC_PROVIDER_NAME, **context},
                      status=status)
