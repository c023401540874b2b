"""``colony shell --attach`` on a notebook job (``colony jupyter``) says what it is and where it
opens, rather than calling it a batch job; the session API says the same to any other client."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents import tunnel_protocol
from jobs.choices import JobState
from tests.cluster_ui.cli.helpers import point_at, run
from tests.factories import JobFactory


@pytest.fixture
def notebook(vision, alice):
    return JobFactory(tenant=vision, owner=alice, state=JobState.RUNNING, command=["jupyter", "lab"],
                      env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "1200"})


def test_shell_attach_to_a_notebook_says_it_is_one_and_where_to_open_it(live_server, transactional_db, monkeypatch,
                                                                         tmp_path, capsys, alice, notebook):
    point_at(monkeypatch, tmp_path, live_server.url, alice)
    code, out, err = run(capsys, "shell", "--attach", str(notebook.pk))
    assert code != 0
    assert "batch job" not in out + err
    assert f"job {notebook.pk} is a notebook session" in err
    assert f"{live_server.url}/jobs/{notebook.pk}/notebook/" in err


def test_the_session_api_says_a_notebook_is_no_terminal(alice, notebook):
    api = APIClient()
    api.force_authenticate(alice)
    answer = api.post(f"/api/v1/jobs/{notebook.pk}/session/input/", {"data": "bHMK"}, format="json")
    assert answer.status_code == 404
    detail = answer.json()["error"]["message"]
    assert "batch job" not in detail and "notebook session" in detail
    assert f"/jobs/{notebook.pk}/notebook/" in detail
