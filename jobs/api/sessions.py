"""REST API v1 for interactive sessions (``colony shell``): type into a running session's terminal
and read what it prints. Only the job's owner may do either; a job you may not see is a 404, as
on every job endpoint (a teammate may watch). The relay itself is :mod:`jobs.services.sessions`.

- ``POST /api/v1/jobs/<id>/session/input/`` (its owner only) ``{"data": base64, "rows": N, "cols": N}`` (each
  optional): at most ``protocol.SESSION_INPUT_BYTES`` bytes of keystrokes a request (413 beyond);
- ``GET /api/v1/jobs/<id>/session/output/?after=<cursor>&wait=<s>``: what the terminal printed
  after ``cursor`` (base64), waiting up to ``wait`` seconds (at most 20) for something new; with
  the job's state, and ``ended`` once the session's output is all there and the job is over.
  Whoever may see the job may watch (as they may read its logs); only its owner types.
"""

from __future__ import annotations

import base64
import binascii
import re

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from agents import protocol, tunnel_protocol
from cluster_ui.api import tenancy
from cluster_ui.api.errors import Conflict, PayloadTooLarge
from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from jobs.services import sessions


class SessionInputSerializer(serializers.Serializer):
    data = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                 max_length=64 * 1024, help_text="Keystrokes, base64.")
    rows = serializers.IntegerField(required=False, min_value=1, max_value=protocol.TERMINAL_MAX_CELLS)
    cols = serializers.IntegerField(required=False, min_value=1, max_value=protocol.TERMINAL_MAX_CELLS)

    def validate(self, attrs):
        if ("rows" in attrs) != ("cols" in attrs):
            raise ValidationError({"rows": ["Give rows and cols together."]})
        return attrs


def _session_of(view, request, pk: int) -> Job:
    job = get_object_or_404(view.queryset, pk=pk)
    if not sessions.may_attach(request.user, job):
        raise PermissionDenied(f"Only {job.owner.username}, who started it, may type into session {job.pk}.")
    if tunnel_protocol.notebook_idle_s(job.env or {}) is not None:
        where = request.build_absolute_uri(reverse("jobs:notebook", args=[job.pk]))
        raise NotFound(f"Job {job.pk} is a notebook session, not a terminal: open it in a browser at {where}.")
    if not sessions.is_interactive(job):
        raise NotFound(f"Job {job.pk} is a batch job, not an interactive session.")
    return job


class SessionInputView(tenancy.APIView):
    queryset = Job.objects.select_related("owner")

    @extend_schema(request=SessionInputSerializer, responses={202: None, 409: None, 413: None})
    def post(self, request, pk: int):
        """Send keystrokes (and the window's size) to a running session's terminal."""
        job = _session_of(self, request, pk)
        body = SessionInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            data = base64.b64decode(body.validated_data.get("data", ""), validate=True)
        except (binascii.Error, ValueError):
            raise ValidationError({"data": ["Not base64."]}) from None
        if len(data) > protocol.SESSION_INPUT_BYTES:
            raise PayloadTooLarge(f"{len(data)} bytes of input; at most {protocol.SESSION_INPUT_BYTES} a request, "
                                  "so send it in parts.")
        try:
            sessions.send_input(job, data, body.validated_data.get("rows"), body.validated_data.get("cols"))
        except sessions.SessionUnavailable as exc:
            raise Conflict(str(exc)) from None
        return Response({"sent": len(data)}, status=202)


class SessionOutputView(tenancy.APIView):
    queryset = Job.objects.select_related("owner")

    @extend_schema(parameters=[
        OpenApiParameter("after", str, description="the previous answer's `next` (none: from the oldest kept)"),
        OpenApiParameter("wait", float, description="seconds to wait for new output, at most 20 (default 20)"),
    ], responses={200: None})
    def get(self, request, pk: int):
        """What a session's terminal printed, as it prints it (a long poll). Whoever sees the job may
        watch, as they may read its logs; a batch job has no terminal, and its answer no output."""
        job = get_object_or_404(self.queryset, pk=pk)
        after = request.query_params.get("after") or None
        if after is not None and not re.match(sessions.ENTRY_ID_RE, after):
            raise ValidationError({"after": ["Not a cursor (like 1700000000000-0)."]})
        try:
            wait = float(request.query_params.get("wait", sessions.OUTPUT_WAIT_MAX_S))
        except ValueError:
            raise ValidationError({"wait": ["A number of seconds."]}) from None
        if job.state in TERMINAL_STATES or not sessions.is_interactive(job):
            wait = 0.0  # nothing more is coming: drain what is kept
        output = sessions.read_output(job, after, wait if wait == wait else 0.0)  # (NaN waits not)
        job.refresh_from_db(fields=["state", "exit_code", "error"])
        ended = job.state in TERMINAL_STATES and (output.eof or not output.data)
        return Response({
            "id": job.pk, "state": job.state, "exit_code": job.exit_code, "error": job.error or None,
            "data": base64.b64encode(output.data).decode(), "gap": output.gap, "eof": output.eof,
            "next": output.next, "ended": ended, "interactive": sessions.is_interactive(job),
        })
