"""One writer of ``Job.state``, held at run time: every SQL statement Django sends is looked at,
and one that changes a job's state from anywhere but the :mod:`jobs.services.lifecycle` package
is refused with :class:`StateWriteRefused` before it reaches the database.

Watching the SQL rather than the ORM's methods catches every way of writing it at once:
``update(state=...)`` and ``update(**{"state": ...})``, ``save(update_fields=["state"])`` after a
``setattr``, ``bulk_update(..., ["state"])``, ``create(state=...)`` of a job born in any state but
PENDING, raw SQL through ``connection.cursor()``, from any package. A plain ``save()`` of a whole
job writes every column; outside the lifecycle it leaves ``state`` out (:func:`saving`), and
refuses if the job's state was changed.

The writer is the innermost frame of project code on the stack (Django's and factory_boy's frames
are passed over). Besides the lifecycle, harnesses that build a world directly may write:
the tests' fixtures, and the bench, which plays the agents' reports at a scale where the
lifecycle's per-job timeline would be what it measured.

The check costs a substring test per statement; the stack is read only for a statement that
writes a job's state, which the lifecycle does a handful of times per scheduling cycle.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from django.db import connections
from django.db.backends.signals import connection_created

ROOT = Path(__file__).resolve().parents[1]
WRITER = "jobs.services.lifecycle"  # the package: each of its modules moves jobs one way
# Module (or package) -> why it may write a job's state without the lifecycle.
HARNESSES = {
    "tests": "fixtures put jobs in the state a test starts from",
    "bench.scheduling_loop": "plays the agents' start and exit reports for thousands of jobs at once",
}
# Frames passed over on the way to the writer: the ORM (and ``Job.save``), the test factories, decorators.
PASSED_OVER = ("django", "factory", "contextlib", "functools", "psycopg", "psycopg2", "jobs.models", "jobs.state_guard")

TABLE = "jobs_job"
BORN_IN = "PENDING"

_UPDATE = re.compile(rf'^\s*UPDATE\s+"?{TABLE}"?\s', re.IGNORECASE)
# An assignment to the column, never a condition on it: Django qualifies the columns of a WHERE
# ("jobs_job"."state" = %s), and a condition follows WHERE, AND or OR, not SET or a comma.
_SETS_STATE = re.compile(r'(?:\bSET\s+|,\s*)"?state"?\s*=', re.IGNORECASE)
_INSERT = re.compile(rf'^\s*INSERT\s+INTO\s+"?{TABLE}"?\s*\(([^)]*)\)', re.IGNORECASE)


class StateWriteRefused(RuntimeError):
    """Code other than the lifecycle tried to change a job's state."""


def _in(module: str, names) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def _module_of(frame) -> str:
    module = frame.f_globals.get("__name__", "")
    if module != "__main__":
        return module
    # A script of the project (``python bench/scheduling_loop.py``) is named by its path.
    path = Path(frame.f_globals.get("__file__") or "").resolve()
    return ".".join(path.relative_to(ROOT).with_suffix("").parts) if path.is_relative_to(ROOT) else module


def writer() -> str:
    """The module of the innermost frame of project code on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        module = _module_of(frame)
        if not _in(module, PASSED_OVER):
            return module
        frame = frame.f_back
    return ""


def may_write(module: str) -> bool:
    return _in(module, (WRITER,)) or _in(module, HARNESSES)


def _inserted_states(sql: str, params, many: bool) -> list | None:
    """The states an INSERT into the jobs table gives its rows ([] when it names no state column),
    or None where they cannot be read from the parameters (literals in raw SQL)."""
    match = _INSERT.match(sql)
    columns = [column.strip().strip('"').lower() for column in match.group(1).split(",")]
    if "state" not in columns:
        return []
    at, width = columns.index("state"), len(columns)
    rows = list(params or ()) if many else [params or ()]
    states = []
    for row in rows:
        row = list(row)
        if len(row) == width and isinstance(row[at], (list, tuple)):  # one array per column (unnest)
            states.extend(row[at])
        elif row and len(row) % width == 0:  # VALUES (...), (...): one parameter per column per row
            states.extend(row[at::width])
        else:
            return None
    return states


def writes_state(sql: str, params=None, many: bool = False) -> bool:
    """Whether this statement changes the state of a job (an INSERT of a job born PENDING does not)."""
    if TABLE not in sql:
        return False
    if _UPDATE.match(sql):
        return bool(_SETS_STATE.search(sql.split(" WHERE ", 1)[0] if " WHERE " in sql else sql))
    if _INSERT.match(sql):
        states = _inserted_states(sql, params, many)
        return states is None or any(str(state) != BORN_IN for state in states)
    return False


def refuse_unless_writer(what: str) -> None:
    module = writer()
    if not may_write(module):
        raise StateWriteRefused(
            f"{module or 'unknown code'} {what}: a job's state changes only through {WRITER}, whose functions "
            "fence each change on the state they expect and record it on the job's timeline")


def _guard(execute, sql, params, many, context):
    if isinstance(sql, str) and writes_state(sql, params, many):
        refuse_unless_writer("writes a job's state")
    return execute(sql, params, many, context)


def saving(job, kwargs: dict) -> None:
    """Called by ``Job.save``: a whole-row save outside the lifecycle writes every column but the
    state, and refuses when the job's state differs from the stored one (one query, only then)."""
    if job._state.adding or kwargs.get("update_fields") is not None or may_write(writer()):
        return
    stored = type(job)._base_manager.filter(pk=job.pk).values_list("state", flat=True).first()
    if stored is not None and stored != job.state:
        refuse_unless_writer(f"saves job {job.pk} as {job.state} (it is {stored})")
    if stored is not None:
        kwargs["update_fields"] = [field.name for field in job._meta.concrete_fields
                                   if not field.primary_key and field.name != "state"]


def _watch(sender, connection, **kwargs) -> None:
    if _guard not in connection.execute_wrappers:
        connection.execute_wrappers.append(_guard)


def install() -> None:
    """Watch every database connection, those already open and those opened later."""
    connection_created.connect(_watch, dispatch_uid="jobs.state_guard")
    for connection in connections.all(initialized_only=True):
        _watch(None, connection)
