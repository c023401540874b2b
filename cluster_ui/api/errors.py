"""One error format for the whole REST API, applied in one place (DRF's EXCEPTION_HANDLER).

Every error answers ``{"error": {"code", "message", "fields"}}``:

- ``code``: a short machine word (``invalid``, ``not_found``, ``not_authenticated``, ``throttled``,
  ``conflict`` ...), taken from the exception;
- ``message``: one sentence a person can read;
- ``fields``: for validation errors, the messages keyed by field name exactly as the serializer
  produced them (``{"gpus": ["..."]}``); empty otherwise.

A throttled request also carries ``retry_after`` (seconds) next to the ``Retry-After`` header.
A body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is a 413 ``payload_too_large``: Django raises
``RequestDataTooBig`` from the Content-Length before reading the body, and it is answered here
rather than as Django's bare 400 page.
Views signal conflicts by raising :class:`Conflict` rather than building a response by hand, so
that nothing escapes the format.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied, RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.views import exception_handler as drf_exception_handler

NON_FIELD = "non_field_errors"


class Conflict(exceptions.APIException):
    """The request is well formed but the resource is in the wrong state for it (409)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the resource's current state."
    default_code = "conflict"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def exception_handler(exc, context):
    # DRF turns Django's Http404 and PermissionDenied into its own; do the same to read their codes.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(_not_found(exc))
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")
    response = drf_exception_handler(exc, context)
    if response is None:  # not an API error: let Django answer 500 (and log it)
        return None
    response.data = error_body(exc, response.data)
    return response


_DJANGO_NOT_FOUND = re.compile(r"^No (\w+) matches the given query\.$")


def _not_found(exc: Http404) -> str:
    """Django's "No Job matches the given query." in our words; a job of another tenant is as
    absent as one that never was, and the message must not say otherwise."""
    text = str(exc.args[0]) if exc.args else ""
    match = _DJANGO_NOT_FOUND.match(text)
    if match:
        return f"No such {match.group(1).lower()}, or not one you can see."
    return text or "Not found."


def error_body(exc: Exception, data) -> dict:
    if isinstance(exc, exceptions.ValidationError):
        return {"error": _validation(data)}
    code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    if not isinstance(code, str):
        code = getattr(exc, "default_code", "error")
    message = data.get("detail", "") if isinstance(data, dict) else str(data)
    body = {"code": code, "message": str(message), "fields": {}}
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        body["retry_after"] = int(exc.wait + 0.999)
    return {"error": body}


def _validation(data) -> dict:
    if isinstance(data, dict):
        fields = {name: errors for name, errors in data.items() if name != NON_FIELD}
        general = [str(e) for e in data.get(NON_FIELD, [])]
    else:  # ValidationError("...") or ValidationError([...]) raised outside a field
        fields, general = {}, [str(e) for e in (data if isinstance(data, list) else [data])]
    if general:
        message = " ".join(general)
    elif len(fields) == 1:
        name, errors = next(iter(fields.items()))
        message = f"{name}: {_first(errors)}"
    else:
        message = f"Invalid input in {', '.join(sorted(fields))}." if fields else "Invalid input."
    return {"code": "invalid", "message": message, "fields": fields}


def _first(errors) -> str:
    """The first message in a field's (possibly nested: list items, dict keys) errors."""
    while isinstance(errors, (list, dict)) and errors:
        errors = errors[0] if isinstance(errors, list) else next(iter(errors.values()))
    return str(errors)
