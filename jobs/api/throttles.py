"""Per-user limit on job submissions (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["submit"]``).

Installed as a default throttle class so that it needs no change in the views: it counts only
requests that create a job (the ``create`` action of the ``job`` viewset); every other request
passes untouched. A refused request gets 429 with ``Retry-After`` (DRF sets the header from
``wait()``; the error body repeats it as ``retry_after``).

The history lives in Django's default cache: configure a shared cache (Redis) in production so
that every web worker counts against the same limit.
"""

from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

SUBMISSION_VIEWS = {"job"}  # router basenames whose ``create`` submits work


class SubmissionRateThrottle(SimpleRateThrottle):
    scope = "submit"

    def get_rate(self):
        # Read at request time (not import time) so that a changed setting takes effect.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        if not _is_submission(request, view):
            return True
        return self.allow_submission(request)

    def allow_submission(self, request) -> bool:
        """Count one submission by ``request.user``; the submit page calls this too, so the
        browser and the API draw on one budget per user."""
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, None)

    def get_cache_key(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return None  # anonymous requests are refused by authentication anyway
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


def _is_submission(request, view) -> bool:
    return (
        request.method == "POST"
        and getattr(view, "action", None) == "create"
        and getattr(view, "basename", None) in SUBMISSION_VIEWS
    )
