"""Fuzz every REST operation from the API's own OpenAPI schema (schemathesis, on hypothesis).

The schema is read from /api/schema/ and every request goes through the project's WSGI application
in process, authenticated with a seeded researcher's token. Schemathesis sends documented examples,
boundary values and random valid and invalid data. No operation may answer 5xx, and every response
must match what the schema documents for its status code (body, content type, headers).

Examples are bounded and derandomized, so the run is quick (about 10 s on two cores) and repeatable;
a failure prints a curl line that reproduces it. For a deeper run, raise EXAMPLES_PER_OPERATION
and set derandomize=False locally.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
)

from cluster_ui.wsgi import application

EXAMPLES_PER_OPERATION = 25
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance, response_headers_conformance]



@schemathesis.serializer("application/gzip")
def _archive_bytes(ctx, value) -> bytes:
    """Code uploads are raw bytes: whatever the fuzzer drew, as bytes (mostly not an archive)."""
    return value if isinstance(value, bytes) else str(value).encode()


# Loaded when the module is collected (schemathesis' fixture-based loader does not work on pytest 9).
# Drawing the schema reads no database; the fuzzing requests run inside each test's transaction.
schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


@pytest.fixture(autouse=True)
def _keep_test_connection(db, live_redis, monkeypatch):
    """A request must not close the connection that holds the test's (rolled back) transaction.

    Django's test client disconnects the same handler; here the real WSGI application is called.
    Webhook host names the fuzzer draws are not looked up in DNS (some hang for seconds here):
    they resolve to a documentation address (refused as not public: the fuzz looks for 5xx, not 201).
    """
    from jobs.services import notifications

    monkeypatch.setattr(notifications, "_resolve", lambda host, *args, **kwargs: ["192.0.2.1"], raising=True)
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_operation_answers_5xx_or_breaks_its_schema(case, token):
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)
