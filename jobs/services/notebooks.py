"""Notebook sessions on the control plane (``colony jupyter``): who may open one, the short-lived
ticket the job page hands the browser, the cookie the notebook proxy sets from it, and the token
each notebook server demands.

- The **token** each notebook server demands: :mod:`jobs.services.notebook_tokens`.
- The **ticket**: ``GET /jobs/<id>/notebook/`` (the job page's "Open notebook") gives one only
  to who may attach (:func:`jobs.services.sessions.may_attach`: the job's owner), while the job
  runs; it names the user, the job and the attempt's node and launch, is signed with the
  server's secret and lives ``TICKET_S``. The proxy trades it for a cookie scoped to the job's
  path (``COOKIE_S``), signed in another salt so that neither passes for the other.

What must not live here: HTTP (``jobs.notebook_proxy``), the node's half (:mod:`agents.notebooks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing

from agents import tunnel_protocol
from jobs.choices import JobState
from jobs.models import Job
from jobs.services.commands import launch_id
from jobs.services.sessions import may_attach, session_node

TICKET_S = 60
COOKIE_S = 12 * 3600
_TICKET_SALT = "colony.notebook.ticket"
_COOKIE_SALT = "colony.notebook.cookie"
TICKET_PARAM = "colony_ticket"


class NotebookUnavailable(Exception):
    """No notebook to open now; the message says why, for the user. ``status``: the HTTP status."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Pass:
    """What a valid ticket or cookie says: who, which job, and where its attempt runs."""

    user_id: int
    job_id: int
    node: str
    launch_id: str

    def as_dict(self) -> dict:
        return {"u": self.user_id, "j": self.job_id, "n": self.node, "l": self.launch_id}


def is_notebook(job: Job) -> bool:
    return tunnel_protocol.notebook_idle_s(job.env or {}) is not None


def ticket_for(user, job: Job) -> str:
    """A ticket for ``user`` to open ``job``'s notebook, or :class:`NotebookUnavailable`."""
    if not is_notebook(job):
        raise NotebookUnavailable(f"Job {job.pk} is not a notebook session.", 404)
    if not may_attach(user, job):
        raise NotebookUnavailable(f"Only {job.owner.username}, who started it, may open the notebook of job {job.pk}.",
                                  403)
    if job.state != JobState.RUNNING:
        raise NotebookUnavailable(f"Job {job.pk} is {job.state.lower()}, not running: there is no notebook to open.")
    node = session_node(job)
    if node is None:
        raise NotebookUnavailable(f"Job {job.pk} holds no node now.")
    grant = Pass(user.pk, job.pk, node, launch_id(job.pk, job.attempt))
    return signing.dumps(grant.as_dict(), salt=_TICKET_SALT, compress=False)


def _load(value: str, salt: str, max_age: int, job_id: int) -> Pass | None:
    try:
        data = signing.loads(value, salt=salt, max_age=max_age)
        grant = Pass(int(data["u"]), int(data["j"]), str(data["n"]), str(data["l"]))
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return None
    return grant if grant.job_id == job_id else None


def open_ticket(value: str, job_id: int) -> Pass | None:
    """What a ticket for ``job_id`` grants; None if forged, for another job, or older than TICKET_S."""
    return _load(value, _TICKET_SALT, TICKET_S, job_id)


def cookie_for(grant: Pass) -> str:
    return signing.dumps(grant.as_dict(), salt=_COOKIE_SALT, compress=False)


def open_cookie(value: str, job_id: int) -> Pass | None:
    """What a notebook cookie for ``job_id`` grants; None if forged, for another job, or expired."""
    return _load(value, _COOKIE_SALT, COOKIE_S, job_id)


COOKIE_PREFIX = "colony_nb_"


def cookie_name(job_id: int) -> str:
    return f"{COOKIE_PREFIX}{int(job_id)}"


def proxy_url(request) -> str:
    """Where the browser reaches the notebook proxy: ``COLONY_NOTEBOOK_URL`` if set, else the
    host the dashboard was reached at, on the proxy's port (what ``make run`` serves)."""
    if settings.COLONY_NOTEBOOK_URL:
        return settings.COLONY_NOTEBOOK_URL
    host = request.get_host().rsplit(":", 1)[0] if not request.get_host().endswith("]") else request.get_host()
    return f"{request.scheme}://{host}:{settings.COLONY_NOTEBOOK_PORT}"
