"""Pending reasons are one vocabulary: every code a job can show is a ``ReasonCode`` built by a
constructor in ``jobs/scheduling/reasons.py``, and the API schema lists every one of them."""

import ast
from pathlib import Path

import pytest

from jobs.scheduling.reasons import ReasonCode

REPO = Path(__file__).resolve().parents[2]


def _hand_built_reasons(path: Path) -> list[int]:
    """Lines of dict literals shaped like a reason ({"code": ..., "message": ...}) and of
    ``PendingReason(...)`` built outside the constructors."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"code", "message"} <= keys:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "PendingReason":
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_reasons_module_builds_a_reason_by_hand():
    found = {}
    # Where job state is written (the API's error bodies share the keys but are not reasons).
    # (The trace replay's baseline policies word their own reasons: nobody reads them but the replay.)
    for folder in ("jobs/services", "jobs/scheduling", "monitoring/services"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "reasons.py" or "policies" in path.parts:
                continue
            if lines := _hand_built_reasons(path):
                found[str(path.relative_to(REPO))] = lines
    assert found == {}, "build reasons with jobs.scheduling.reasons' constructors"


@pytest.mark.django_db
def test_the_api_schema_lists_every_reason_code(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    code = schema["components"]["schemas"]["PendingReason"]["properties"]["code"]
    ref = code.get("$ref") or code["allOf"][0]["$ref"]
    enum = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["enum"]
    assert set(enum) == {code.value for code in ReasonCode}
