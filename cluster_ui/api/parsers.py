"""Request body parsers for the REST API: DRF's own, plus the limits that hostile input needs.

- A body must be valid text in its declared charset (UTF-8 unless the Content-Type names another):
  anything else is a 400 ``parse_error``, never a 500 nor silently replaced characters.
- JSON nested deeper than ``COLONY_MAX_JSON_DEPTH`` is refused before it is decoded: Python's
  decoder recurses, and a body of 100,000 ``[`` would otherwise end in a RecursionError (a 500).

Size: Django refuses a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` from its Content-Length before
anything reads it (``RequestDataTooBig``), and ``cluster_ui.api.errors`` answers that with a 413. DRF
hands the JSON and form parsers the body through that check (they stay subclasses of DRF's for that
reason); multipart is streamed instead, and Django would hold only its non-file fields to the
limit, so that parser makes the same check itself.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import QueryDict
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

# A JSON string (escapes included), then any bracket outside one.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting_exceeds(text: str, limit: int) -> bool:
    """Whether arrays/objects in ``text`` nest deeper than ``limit``, found without decoding it."""
    depth = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _read_text(stream, parser_context) -> tuple[str, str]:
    encoding = parsers.get_encoding(parser_context or {})
    try:
        return stream.read().decode(encoding), encoding
    except UnicodeDecodeError:
        raise ParseError(f"The request body is not valid {encoding} text.") from None


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        text, _ = _read_text(stream, parser_context)
        limit = settings.COLONY_MAX_JSON_DEPTH
        if json_nesting_exceeds(text, limit):
            raise ParseError(f"JSON nested deeper than {limit} levels is not accepted.")
        try:
            return json.loads(text, parse_constant=json.strict_constant if self.strict else None)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        text, encoding = _read_text(stream, parser_context)
        try:
            # Percent-escapes must decode too (Django's QueryDict would replace bad ones with U+FFFD).
            parse_qsl(text, keep_blank_values=True, encoding=encoding, errors="strict",
                      max_num_fields=settings.DATA_UPLOAD_MAX_NUMBER_FIELDS)
        except UnicodeDecodeError:
            raise ParseError(f"The request body is not valid {encoding} text.") from None
        except ValueError:
            raise ParseError("Too many form fields.") from None
        return QueryDict(text, encoding=encoding)


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {})["request"]
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")
        return super().parse(stream, media_type, parser_context)
