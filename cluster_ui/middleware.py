"""Request middleware of our own. Each piece guards every page and API view at once, so that no
view has to remember it; keep it small, and keep anything that needs the database out of here.
"""

from __future__ import annotations

from urllib.parse import unquote

from django.http import HttpResponseBadRequest, JsonResponse
from rest_framework.exceptions import ValidationError

from cluster_ui.api.errors import error_body

NUL_IN_URL = "The URL contains a NUL character (%00)."


class RefuseNulInUrlMiddleware:
    """A NUL character in the path or query string is a 400, before any view runs.

    PostgreSQL text cannot hold NUL, so a lookup or filter on ``?tenant=%00`` or ``/nodes/%00/``
    would otherwise fail in the database driver with a 500. No name, slug or filter value of ours
    contains one.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path or "\x00" in unquote(request.META.get("QUERY_STRING", "")):
            if request.path.startswith("/api/"):
                refusal = ValidationError(NUL_IN_URL)
                return JsonResponse(error_body(refusal, refusal.detail), status=400)
            return HttpResponseBadRequest(NUL_IN_URL, content_type="text/plain")
        return self.get_response(request)
