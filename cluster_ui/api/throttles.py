"""Per-user limit on job submissions (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["submit"]``).

Installed as a default throttle class so that it needs no change in the views: it counts only
requests that create jobs (the ``create`` and ``bulk`` actions of the ``job`` viewset); every other
request passes untouched. A refused request gets 429 with ``Retry-After`` (DRF sets the header from
``wait()``; the error body repeats it as ``retry_after``).

A bulk submission (``POST /api/v1/jobs/bulk/``, up to 1,000 jobs) counts as one submission, so
that the 1,000-job request README promises goes through on the default rate; what bounds a flood
of jobs is ``COLONY_MAX_PENDING_PER_USER`` (jobs waiting at once), checked however they come.
The refusal names the rate and its setting (``COLONY_SUBMIT_RATE``).

The history lives in Django's default cache: configure a shared cache (Redis) in production so
that every web worker counts against the same limit.
"""

from __future__ import annotations

from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

SUBMISSION_VIEWS = {"job"}  # router basenames whose ``create`` and ``bulk`` submit work
SUBMISSION_ACTIONS = {"create", "bulk"}
PERIODS = {1: "a second", 60: "a minute", 3600: "an hour", 86400: "a day"}


class SubmissionRateThrottle(SimpleRateThrottle):
    scope = "submit"

    def get_rate(self):
        # Read at request time (not import time) so that a changed setting takes effect.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        if not _is_submission(request, view):
            return True
        if not self.allow_submission(request):
            raise self.refusal()
        return True

    def refusal(self) -> Throttled:
        """The 429 to raise when :meth:`allow_submission` said no: it names the rate and its knob."""
        return Throttled(wait=self.wait(), detail=(
            f"You are submitting faster than allowed: at most {self.num_requests} submissions "
            f"{PERIODS.get(self.duration, f'per {self.duration} s')} (COLONY_SUBMIT_RATE={self.rate}); "
            "a bulk request or a code upload counts as one."))

    def rate_limit(self) -> int | None:
        """Submissions allowed per period now, or None when unlimited."""
        self.rate = self.get_rate()
        if self.rate is None:
            return None
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return self.num_requests

    def allow_submission(self, request) -> bool:
        """Count one submission by ``request.user``; the submit page and code uploads call this
        too, so the browser and the API draw on one budget per user."""
        if self.rate_limit() is None:
            return True
        return super().allow_request(request, None)

    def get_cache_key(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return None  # anonymous requests are refused by authentication anyway
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


def _is_submission(request, view) -> bool:
    return (
        request.method == "POST"
        and getattr(view, "action", None) in SUBMISSION_ACTIONS
        and getattr(view, "basename", None) in SUBMISSION_VIEWS
    )
