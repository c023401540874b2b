"""Per-user limit on job submissions (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["submit"]``).

Installed as a default throttle class so that it needs no change in the views: it counts only
requests that create a job (the ``create`` action of the ``job`` viewset); every other request
passes untouched. A refused request gets 429 with ``Retry-After`` (DRF sets the header from
``wait()``; the error body repeats it as ``retry_after``).

A bulk submission (``POST /api/v1/jobs/bulk/``) passes here uncounted: its view counts it as one
submission per job (:meth:`SubmissionRateThrottle.allow_submission` with ``count``) once it knows
how many, so bulk is no way around the rate.

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

    def rate_limit(self) -> int | None:
        """Submissions allowed per period now, or None when unlimited."""
        self.rate = self.get_rate()
        if self.rate is None:
            return None
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return self.num_requests

    def allow_submission(self, request, count: int = 1) -> bool:
        """Count ``count`` submissions by ``request.user``, all or none; the submit page calls this
        too, so the browser and the API draw on one budget per user."""
        self.count = count
        if self.rate_limit() is None:
            return True
        if count == 1:
            return super().allow_request(request, None)
        self.key = self.get_cache_key(request, None)
        if self.key is None:
            return True
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        if len(self.history) + count > self.num_requests:
            return self.throttle_failure()
        # One entry per job, so that single submissions after it see the budget it took.
        self.history[:0] = [self.now] * count
        self.cache.set(self.key, self.history, self.duration)
        return True

    def wait(self):
        count = getattr(self, "count", 1)
        if count == 1 or count > self.num_requests:
            return super().wait()
        # Until enough of the oldest entries (the history is newest first) have expired.
        expiring = len(self.history) + count - self.num_requests
        return max(0.0, self.duration - (self.now - self.history[-expiring]))

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
