"""The jobs written since a read of the queue, found by an index rather than by listing every pending
job (PostgreSQL, migration jobs 0023).

Every write to a job row stamps it with the id of the writing transaction (``changed_xid``). A
reader takes, before it reads the queue, the oldest transaction still running
(``pg_snapshot_xmin``, the horizon): every transaction older than that had ended, so whatever it
wrote is in the read. The next time, the rows stamped at or past the horizon are all that can have
changed since: those of transactions that ended after the read, and some the read saw already (read
again, harmlessly). A transaction that had not written yet when the horizon was taken gets a
younger id when it does. So a cycle after a few jobs ended reads those few rows' ids and versions,
at 200,000 pending as at 50,000; listing the queue cost a tenth of a second of both processes'
CPU a cycle there.

A delete leaves no row to find: a transaction deleting jobs moves a mark of its own, and the
reader lists the queue again when it moved. The triggers fire in every session (``ENABLE
ALWAYS``: a replica's too); one missing or disabled, or disabled and enabled again since the last
full read (its row in ``pg_trigger`` at a new version), makes the feed answer nothing, and the
reader lists as before: slower, never stale. So does a horizon past every transaction yet (one
kept from another cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from jobs.choices import JobState

TRIGGERS = ("colony_count_job_delete", "colony_count_job_truncate", "colony_stamp_xid")
DELETED = "jobs_job:deleted"


@dataclass(frozen=True)
class Changes:
    """The jobs written since the last read: ``pending`` as ``id:xmin`` items of those pending now,
    ``left`` the ids of those that are not; with the horizon and the feed's state to keep once applied,
    and the table's change mark read in the same statement."""

    pending: list[str]
    left: set[int]
    horizon: str
    state: str | None
    mark: str | None


def _state_sql(table: str) -> str:
    """The horizon now; the feed's state, which a full read must have seen for the feed to serve
    (the delete mark, and the triggers' own row versions: a trigger disabled and enabled again
    between two reads may have let a write through unstamped); and whether the triggers are there
    and on."""
    names = ", ".join(f"'{name}'" for name in TRIGGERS)
    triggers = f"FROM pg_trigger WHERE tgrelid = '{table}'::regclass AND tgname IN ({names})"
    return ("pg_snapshot_xmin(pg_current_snapshot())::text, "
            "(SELECT COALESCE(string_agg(slot::text || ':' || changed::text, ',' ORDER BY slot), '') "
            f"FROM colony_table_changes WHERE table_name = '{DELETED}') "
            f"|| ' ' || (SELECT string_agg(xmin::text, ',' ORDER BY tgname) {triggers}), "
            f"(SELECT count(*) {triggers} AND tgenabled IN ('O', 'A')) = {len(TRIGGERS)}")


class JobFeed:
    """Where the last read of the pending jobs left the feed: the horizon taken before it and the
    feed's state then. One per reader of the queue."""

    def __init__(self) -> None:
        self._horizon: str | None = None
        self._state: str | None = None

    def before_full_read(self, table: str) -> tuple[str, str | None] | None:
        """To be called before a full read of the queue, in the same connection; what to hand
        :meth:`after_full_read` once it is done (None: the feed cannot serve, and is not set)."""
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {_state_sql(table)}")
            horizon, state, usable = cursor.fetchone()
        return (horizon, state) if usable else None

    def after_full_read(self, token: tuple[str, str | None] | None) -> None:
        self._horizon, self._state = token if token is not None else (None, None)

    def changes(self, table: str, mark: str) -> Changes | None:
        """The jobs written since the last read, or None where the feed cannot tell (no read yet,
        a delete since, a trigger missing, off or switched since): then list the queue in full."""
        if self._horizon is None:
            return None
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT string_agg(id::text || ':' || xmin::text, ',') FILTER (WHERE state = %s), "
                f"string_agg(id::text, ',') FILTER (WHERE state <> %s), "
                f"{_state_sql(table)}, {mark}, %s::xid8 <= pg_snapshot_xmax(pg_current_snapshot()) "
                f"FROM {table} WHERE changed_xid >= %s::xid8",
                [JobState.PENDING.value, JobState.PENDING.value, self._horizon, self._horizon])
            pending, left, horizon, state, usable, marked, plausible = cursor.fetchone()
        # (a horizon past every transaction yet: another cluster's, restored or failed over to)
        if not usable or not plausible or state != self._state:
            return None
        return Changes(pending.split(",") if pending else [], set(map(int, left.split(","))) if left else set(),
                       horizon, state, marked)

    def advance(self, changes: Changes) -> None:
        """``changes`` were applied: the next read starts from where they were read."""
        self._horizon, self._state = changes.horizon, changes.state
