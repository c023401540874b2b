"""Notebook sessions on the control plane: submitting one marks the job (and keeps the server's
token out of what teammates may read); its launch, and only its, carries the token; the job
page's Open notebook hands a ticket to the job's owner alone, while it runs, and sends the
browser to the proxy; a forged, expired or other job's ticket opens nothing."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing as django_signing

from agents import protocol, tunnel_protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import notebook_tokens, notebooks
from jobs.services.commands import launch_commands
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def notebook(db, vision, alice):
    job = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice, command=["jupyter", "lab"],
                     env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "600"})
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name="node-a"), index=0))
    return job


def test_submitting_a_notebook_marks_it_and_shows_no_token(api, alice, vision, settings):
    answer = api(alice).post("/api/v1/jobs/", {"command": ["jupyter", "lab"], "gpus": 1, "notebook": True,
                                               "idle_timeout_s": 3600}, format="json")
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.env == {tunnel_protocol.NOTEBOOK_IDLE_ENV: "3600"} and job.max_nodes == 1
    shown = api(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["session"] == {"idle_timeout_s": 3600, "kind": "notebook", "open": f"/jobs/{job.pk}/notebook/"}
    assert tunnel_protocol.NOTEBOOK_TOKEN_ENV not in str(shown)


def test_a_session_is_a_terminal_or_a_notebook_not_both(api, alice, vision):
    answer = api(alice).post("/api/v1/jobs/", {"command": ["jupyter", "lab"], "gpus": 1, "notebook": True,
                                               "interactive": True}, format="json")
    assert answer.status_code == 400 and "notebook" in answer.json()["error"]["fields"]
    answer = api(alice).post("/api/v1/jobs/", {"command": ["jupyter", "lab"], "gpus": 1, "notebook": True,
                                               "array": "0-3"}, format="json")
    assert answer.status_code == 400 and "array" in answer.json()["error"]["fields"]


def test_only_a_notebooks_launch_carries_its_token_new_for_each_attempt(settings):
    env = {tunnel_protocol.NOTEBOOK_IDLE_ENV: "600"}
    [first] = launch_commands("node-a", 7, ["jupyter", "lab"], (0,), attempt=0, env=env)
    [second] = launch_commands("node-a", 7, ["jupyter", "lab"], (0,), attempt=1, env=env)
    [batch] = launch_commands("node-a", 8, ["python", "x.py"], (0,), attempt=0, env={"A": "1"})
    token = first.env[tunnel_protocol.NOTEBOOK_TOKEN_ENV]
    assert token == notebook_tokens.token("launch-7-0") and len(token) == 64
    assert second.env[tunnel_protocol.NOTEBOOK_TOKEN_ENV] != token
    assert batch.env == {"A": "1"}
    settings.SECRET_KEY = "another-server-secret-" * 3
    assert notebook_tokens.token("launch-7-0") != token  # unguessable without the server's secret


def test_the_owner_gets_a_ticket_and_is_sent_to_the_proxy(web, alice, notebook, settings):
    settings.COLONY_NOTEBOOK_URL = ""
    settings.COLONY_NOTEBOOK_PORT = 8123
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "colony.test"]
    answer = web(alice).get(f"/jobs/{notebook.pk}/notebook/", HTTP_HOST="colony.test:8000")
    assert answer.status_code == 302
    where = urlsplit(answer["Location"])
    assert (where.scheme, where.netloc, where.path) == ("http", "colony.test:8123", f"/notebooks/{notebook.pk}/")
    [ticket] = parse_qs(where.query)[notebooks.TICKET_PARAM]
    grant = notebooks.open_ticket(ticket, notebook.pk)
    assert grant == notebooks.Pass(alice.pk, notebook.pk, "node-a", f"launch-{notebook.pk}-0")
    assert notebooks.open_ticket(ticket, notebook.pk + 1) is None  # for this job only
    assert notebooks.open_cookie(ticket, notebook.pk) is None  # a ticket is no cookie
    page = web(alice).get(f"/jobs/{notebook.pk}/").content.decode()
    assert "Open notebook" in page and f"/jobs/{notebook.pk}/notebook/" in page


def test_a_teammate_gets_no_ticket_and_another_tenant_sees_no_such_job(web, client, bob, charlie, notebook):
    answer = web(bob).get(f"/jobs/{notebook.pk}/notebook/")
    assert answer.status_code == 302 and answer["Location"] == f"/jobs/{notebook.pk}/"
    assert notebooks.TICKET_PARAM not in answer["Location"]
    page = client.get(answer["Location"]).content.decode()
    assert "Only alice, who started it, may open the notebook" in page and "Open notebook</a>" not in page
    assert web(charlie).get(f"/jobs/{notebook.pk}/notebook/").status_code == 404


def test_no_ticket_for_a_notebook_that_does_not_run_or_a_batch_job(web, alice, notebook, vision):
    Job.objects.filter(pk=notebook.pk).update(state=JobState.SUCCEEDED)
    answer = web(alice).get(f"/jobs/{notebook.pk}/notebook/")
    assert answer.status_code == 302 and notebooks.TICKET_PARAM not in answer["Location"]
    batch = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice, env={})
    with pytest.raises(notebooks.NotebookUnavailable, match="not a notebook"):
        notebooks.ticket_for(alice, batch)
    with pytest.raises(notebooks.NotebookUnavailable, match="succeeded, not running"):
        notebooks.ticket_for(alice, Job.objects.get(pk=notebook.pk))


def test_forged_and_expired_tickets_open_nothing(alice, notebook, monkeypatch):
    ticket = notebooks.ticket_for(alice, notebook)
    assert notebooks.open_ticket(ticket, notebook.pk) is not None
    assert notebooks.open_ticket(ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB"), notebook.pk) is None
    forged = django_signing.dumps({"u": alice.pk, "j": notebook.pk, "n": "node-a", "l": "x"}, key="guessed-key",
                                  salt="colony.notebook.ticket")
    assert notebooks.open_ticket(forged, notebook.pk) is None
    later = time.time() + notebooks.TICKET_S + 1
    monkeypatch.setattr(django_signing.time, "time", lambda: later)
    assert notebooks.open_ticket(ticket, notebook.pk) is None  # a minute later: expired
    cookie = notebooks.cookie_for(notebooks.Pass(alice.pk, notebook.pk, "node-a", "launch-1-0"))
    assert notebooks.open_cookie(cookie, notebook.pk) is not None  # a cookie lives longer


def test_the_session_idle_bounds_apply_to_notebooks():
    assert tunnel_protocol.notebook_idle_s({tunnel_protocol.NOTEBOOK_IDLE_ENV: "1"}) == protocol.SESSION_IDLE_MIN_S
    assert tunnel_protocol.notebook_idle_s({}) is None
