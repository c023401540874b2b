"""Hostile request bodies: too large (413), nested too deep (400), not UTF-8 (400). Nothing is
created, nothing answers 500, and the API answers in its one error format.

Requests go through the whole stack (Django's test client, token authentication as a script sends
it), not through serializers called by hand.
"""

from __future__ import annotations

import json

import pytest

from cluster_ui.api.parsers import json_nesting_exceeds
from jobs.models import Job

JOBS = "/api/v1/jobs/"
TOKEN_URL = "/api/v1/auth/token/"
MIB = 1024 * 1024


@pytest.fixture
def post(client, token):
    """POST a raw body to the API as the seeded researcher."""

    def send(url, body, content_type="application/json"):
        return client.generic("POST", url, body, content_type=content_type, HTTP_AUTHORIZATION=f"Token {token}")

    return send


def submission(**extra) -> dict:
    return {"command": ["python", "train.py"], "gpus": 1, **extra}


def nested(depth: int):
    value = "deep"
    for _ in range(depth):
        value = {"x": value}
    return value


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message", "fields"} <= set(body["error"]), body
    return body["error"]


# ------------------------------------------------------------------------------------------- size

def test_a_2_mib_submission_is_refused_with_413_and_creates_nothing(post):
    before = Job.objects.count()
    body = json.dumps(submission(command=["python", "x" * (2 * MIB)]))
    response = post(JOBS, body)
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "payload_too_large"
    assert "262144 bytes" in error["message"]
    assert Job.objects.count() == before


def test_an_oversized_body_is_refused_from_its_length_before_it_is_parsed(post):
    # Were it parsed, this would be a 400 parse error; the size alone decides.
    response = post(JOBS, b"{" + b"x" * (2 * MIB))
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


def test_the_limit_is_the_configured_one(post, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    small = json.dumps(submission(name="fits"))
    assert post(JOBS, small).status_code == 201
    large = json.dumps(submission(name="too-big", env={"NOTE": "x" * 2048}))
    response = post(JOBS, large)
    assert response.status_code == 413
    assert "2048 bytes" in error_of(response)["message"]
    assert list(Job.objects.filter(name__in=["fits", "too-big"]).values_list("name", flat=True)) == ["fits"]


def test_an_oversized_form_body_is_refused_too(post):
    response = post(JOBS, b"gpus=1&command=" + b"x" * (2 * MIB), content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413


def test_the_token_endpoint_refuses_an_oversized_body(post):
    response = post(TOKEN_URL, json.dumps({"username": "alice", "password": "x" * (2 * MIB)}))
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


def test_an_oversized_page_form_is_a_client_error_not_a_crash(client, researcher):
    client.force_login(researcher)
    client.raise_request_exception = False  # answer as a server would, rather than re-raise here
    before = Job.objects.count()
    response = client.post("/jobs/submit/", {"command": "x" * (2 * MIB), "gpus": "1"})
    assert response.status_code == 400  # Django's own answer to RequestDataTooBig on a page
    assert Job.objects.count() == before


# ------------------------------------------------------------------------------------------ depth

def test_json_nested_100_deep_is_refused_with_400_and_creates_nothing(post):
    before = Job.objects.count()
    response = post(JOBS, json.dumps(submission(env=nested(100))))
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "parse_error"
    assert error["message"] == "JSON nested deeper than 32 levels is not accepted."
    assert Job.objects.count() == before


@pytest.mark.parametrize("url", [JOBS, TOKEN_URL])
def test_pathologically_deep_json_is_a_400_not_a_recursion_error(post, url):
    # 100,000 brackets fit in the size limit and would blow Python's recursion limit in json.loads.
    response = post(url, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    assert error_of(response)["code"] == "parse_error"


def test_json_within_the_depth_limit_is_parsed_and_validated_as_usual(post):
    response = post(JOBS, json.dumps(submission(env=nested(20))))
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid"  # reached the serializer: env values must be strings


def test_the_depth_limit_is_the_configured_one(post, settings):
    settings.COLONY_MAX_JSON_DEPTH = 3
    assert post(JOBS, json.dumps(submission(env={"A": "b"}))).status_code == 201  # depth 2
    response = post(JOBS, json.dumps(submission(gpu_models=[[["A100"]]])))  # depth 4
    assert error_of(response)["message"] == "JSON nested deeper than 3 levels is not accepted."


@pytest.mark.parametrize("text, limit, too_deep", [
    ('{"a": [1, {"b": 2}]}', 3, False),
    ('{"a": [1, {"b": []}]}', 3, True),
    ('["[[[[", "{{{{"]', 1, False),           # brackets inside strings do not count
    (r'["\"[[[[", "\\", "]"]', 1, False),      # nor do they after escaped quotes and backslashes
    ('[]' * 1000, 1, False),                   # wide is fine, only deep is refused
    ('[' * 33 + ']' * 33, 32, True),
    ('[' * 32 + ']' * 32, 32, False),
])
def test_json_nesting_is_measured_without_decoding(text, limit, too_deep):
    assert json_nesting_exceeds(text, limit) is too_deep


# ----------------------------------------------------------------------------------------- encoding

@pytest.mark.parametrize("body, content_type", [
    (b'{"command": ["python", "\xff\xfe"], "gpus": 1}', "application/json"),
    (b'{"command": ["caf\xe9"], "gpus": 1}', "application/json; charset=utf-8"),
    (b"gpus=1&command=caf\xe9", "application/x-www-form-urlencoded"),
    (b"gpus=1&command=caf%E9", "application/x-www-form-urlencoded"),  # a percent-escaped latin-1 byte
])
def test_a_body_that_is_not_utf8_is_refused_with_400(post, body, content_type):
    before = Job.objects.count()
    response = post(JOBS, body, content_type=content_type)
    assert response.status_code == 400
    error = error_of(response)
    assert (error["code"], error["message"]) == ("parse_error", "The request body is not valid utf-8 text.")
    assert Job.objects.count() == before


def test_the_token_endpoint_refuses_a_body_that_is_not_utf8(post):
    response = post(TOKEN_URL, b"username=alice&password=\xff", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert error_of(response)["code"] == "parse_error"


def test_a_declared_charset_is_honoured(post):
    body = json.dumps(submission(name="café"), ensure_ascii=False).encode("latin-1")
    response = post(JOBS, body, content_type="application/json; charset=latin-1")
    assert response.status_code == 201
    assert response.json()["name"] == "café"


def test_utf8_text_is_accepted(post):
    response = post(JOBS, json.dumps(submission(name="résumé-训练"), ensure_ascii=False).encode())
    assert response.status_code == 201
    assert response.json()["name"] == "résumé-训练"


MULTIPART = "multipart/form-data; boundary=x"


def multipart(**fields: bytes) -> bytes:
    parts = [b"--x\r\nContent-Disposition: form-data; name=%s\r\n\r\n%s\r\n" % (name.encode(), value)
             for name, value in fields.items()]
    return b"".join(parts) + b"--x--\r\n"


def test_multipart_bodies_are_held_to_the_same_limit(post):
    # Django alone would count only non-file fields against the limit; the API counts the body.
    file_part = (b'--x\r\nContent-Disposition: form-data; name="upload"; filename="a.bin"\r\n'
                 b"Content-Type: application/octet-stream\r\n\r\n" + b"\0" * (2 * MIB) + b"\r\n")
    response = post(TOKEN_URL, file_part + multipart(username=b"alice", password=b"x"), content_type=MULTIPART)
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


def test_a_small_multipart_form_still_gets_a_token(post):
    from tests.factories import PASSWORD

    response = post(TOKEN_URL, multipart(username=b"alice", password=PASSWORD.encode()), content_type=MULTIPART)
    assert response.status_code == 200
    assert response.json()["token"]


# ------------------------------------------------------------------------------------------ URLs
# PostgreSQL text cannot hold NUL: found by the fuzzer as a 500 on GET /api/v1/gpus/?node=%00.

@pytest.mark.parametrize("url", [
    "/api/v1/gpus/?node=%00", "/api/v1/jobs/?tenant=a%00b", "/api/v1/jobs/?state=%00", "/api/v1/queue/?owner=%00",
    "/api/v1/nodes/%00/", "/api/v1/tenants/%00/",
])
def test_a_nul_in_an_api_url_is_a_400_in_the_api_format(client, token, url):
    response = client.get(url, HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 400
    assert error_of(response) == {"code": "invalid", "message": "The URL contains a NUL character (%00).",
                                  "fields": {}}


@pytest.mark.parametrize("url", ["/jobs/?tenant=%00", "/jobs/?owner=%00", "/nodes/%00/", "/heatmap/?node=%00"])
def test_a_nul_in_a_page_url_is_a_400(client, researcher, url):
    client.force_login(researcher)
    response = client.get(url)
    assert response.status_code == 400
    assert response.content == b"The URL contains a NUL character (%00)."
