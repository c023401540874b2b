"""The jobs, and the stored verdicts, written since a read of them, found by an index rather than by
listing every pending job or every verdict (PostgreSQL, migrations jobs 0023 and 0024).

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
ALWAYS``: a replica's too); one missing, disabled or enabled for ordinary sessions only (a plain
``ENABLE TRIGGER``, as ``pg_restore --disable-triggers`` leaves it), or switched since the last
full read (its row in ``pg_trigger`` at a new version), makes the feed answer nothing, and the
reader lists as before: slower, never stale. So does a horizon past every transaction yet (one
kept from another cluster).

The verdicts (``VerdictFeed``) work the same way but for two things. Their main writer is the loop
itself, which keeps what it wrote (``RowVersions.remember``): its writes are left unstamped (the
setting ``colony.verdicts_by_loop`` around them, :func:`loop_writes_verdicts`), so that 47,000
verdicts written keep their HOT updates and cost no trigger call. And a placement deletes a
verdict every time, so deletes are logged by job id (``colony_deleted_waits``, pruned below the
reader's horizon as it reads), not marked.
"""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection

from jobs.choices import JobState


@dataclass(frozen=True)
class Changes:
    """The rows written since the last read: ``pending`` as ``id:xmin`` items of those the reader's
    listing holds now, ``left`` the ids of those it does not (gone from the queue, or deleted);
    with the horizon and the feed's state to keep once applied, and the table's change mark read
    in the same statement."""

    pending: list[str]
    left: set[int]
    horizon: str
    state: str | None
    mark: str | None


class _Feed:
    """Where the last read of a table left its feed: the horizon taken before it and the feed's
    state then (the marks that make a reader list again, and the triggers' own row versions: a
    trigger disabled and enabled again between two reads may have let a write through
    unstamped). One per reader."""

    table = ""
    triggers: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()
    declines = "false"  # (SQL: true where the transaction under way wrote what the feed cannot show it)

    def __init__(self) -> None:
        self._horizon: str | None = None
        self._state: str | None = None

    def _state_sql(self) -> str:
        """The horizon now, the feed's state, and whether the triggers are there and on for every
        session (``ENABLE ALWAYS``)."""
        names = ", ".join(f"'{name}'" for name in self.triggers)
        marks = ", ".join(f"'{name}'" for name in self.marks)
        triggers = f"FROM pg_trigger WHERE tgrelid = '{self.table}'::regclass AND tgname IN ({names})"
        return ("pg_snapshot_xmin(pg_current_snapshot())::text, "
                "(SELECT COALESCE(string_agg(table_name || slot::text || ':' || changed::text, ',' "
                f"ORDER BY table_name, slot), '') FROM colony_table_changes WHERE table_name IN ({marks})) "
                f"|| ' ' || (SELECT string_agg(xmin::text, ',' ORDER BY tgname) {triggers}), "
                # (fired in every session: one enabled as the default 'O' misses a replica's writes)
                f"(SELECT count(*) {triggers} AND tgenabled = 'A') = {len(self.triggers)}")

    def before_full_read(self) -> tuple[str, str | None] | None:
        """To be called before a full read, in the same connection; what to hand
        :meth:`after_full_read` once it is done (None: the feed cannot serve, and is not set)."""
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self._state_sql()}")
            horizon, state, usable = cursor.fetchone()
        return (horizon, state) if usable else None

    def after_full_read(self, token: tuple[str, str | None] | None) -> None:
        self._horizon, self._state = token if token is not None else (None, None)

    def changes(self, mark: str) -> Changes | None:
        """The rows written since the last read, or None where the feed cannot tell (no read yet,
        a mark moved, a trigger missing, off or switched since): then list in full."""
        if self._horizon is None:
            return None
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self._changed_sql()}, {self._state_sql()}, {mark}, "
                           f"%s::xid8 <= pg_snapshot_xmax(pg_current_snapshot()), {self.declines}",
                           [*self._changed_params(), self._horizon, *self._declines_params()])
            pending, left, horizon, state, usable, marked, plausible, declines = cursor.fetchone()
        # (a horizon past every transaction yet: another cluster's, restored or failed over to)
        if not usable or not plausible or declines or state != self._state:
            return None
        return Changes(pending.split(",") if pending else [], set(map(int, left.split(","))) if left else set(),
                       horizon, state, marked)

    def advance(self, changes: Changes) -> None:
        """``changes`` were applied: the next read starts from where they were read."""
        self._horizon, self._state = changes.horizon, changes.state

    def _declines_params(self) -> list:
        return []

    def _changed_sql(self) -> str:
        raise NotImplementedError

    def _changed_params(self) -> list:
        raise NotImplementedError


class JobFeed(_Feed):
    """The pending jobs: those written since that are pending now, and those that are not."""

    table = "jobs_job"
    triggers = ("colony_count_job_delete", "colony_count_job_truncate", "colony_stamp_xid")
    marks = ("jobs_job:deleted",)

    def _changed_sql(self) -> str:
        stamped = "FROM jobs_job WHERE changed_xid >= %s::xid8"
        return (f"(SELECT string_agg(id::text || ':' || xmin::text, ',') {stamped} AND state = %s), "
                f"(SELECT string_agg(id::text, ',') {stamped} AND state <> %s)")

    def _changed_params(self) -> list:
        return [self._horizon, JobState.PENDING.value, self._horizon, JobState.PENDING.value]


class VerdictFeed(_Feed):
    """The stored verdicts others wrote since (the loop's own are kept as written), and those
    deleted since, by anyone."""

    table = "jobs_jobwait"
    triggers = ("colony_count_wait_truncate", "colony_log_deleted_wait", "colony_stamp_xid")
    marks = ("jobs_jobwait:truncated",)
    # Declines where verdicts this transaction wrote unstamped are kept only once it commits (until
    # then only a listing shows them), where another scheduler process wrote some unstamped since
    # (only it kept them: this one led before, and leads again), and where the logs that say so
    # were pruned past this feed's horizon by another reader (migration jobs 0025).
    declines = ("(current_setting('colony.loop_wrote_verdicts', true) IS NOT DISTINCT FROM '1' "
                "OR EXISTS (SELECT FROM colony_verdict_writers WHERE xid >= %s::xid8 AND writer <> %s) "
                "OR EXISTS (SELECT FROM colony_feed_pruned WHERE feed = 'verdicts' AND below > %s::xid8))")

    # A reader whose feed declines cycle after cycle (a lease passing back and forth between two
    # scheduler processes: each finds the other's writes) lists every cycle and never reaches
    # :meth:`advance`, where the logs are pruned: it prunes once in this many listings instead, so
    # they hold that many cycles' rows at most (one writer's row and the deletes of each), and a
    # process's first read costs no statement more.
    prune_every = 64

    def __init__(self) -> None:
        super().__init__()
        self._listings = 0

    def _declines_params(self) -> list:
        return [self._horizon, writer(), self._horizon]

    def _changed_sql(self) -> str:
        # (a job whose verdict was deleted and written again since is not gone: it is read again)
        return ("(SELECT string_agg(job_id::text || ':' || xmin::text, ',') FROM jobs_jobwait "
                "WHERE changed_xid >= %s::xid8), "
                "(SELECT string_agg(DISTINCT job_id::text, ',') FROM colony_deleted_waits AS deleted "
                "WHERE xid >= %s::xid8 AND NOT EXISTS (SELECT FROM jobs_jobwait AS wait "
                "WHERE wait.job_id = deleted.job_id))")

    def _changed_params(self) -> list:
        return [self._horizon, self._horizon]

    def advance(self, changes: Changes) -> None:
        super().advance(changes)
        self._listings = 0
        _prune_verdict_logs(changes.horizon)

    def after_full_read(self, token: tuple[str, str | None] | None) -> None:
        super().after_full_read(token)
        if token is None:
            return
        self._listings += 1
        if self._listings >= self.prune_every:
            self._listings = 0
            _prune_verdict_logs(token[0])

    def held(self) -> tuple[str | None, str | None]:
        """Where the feed stands, taken away until :meth:`after_full_read` hands it back: read in a
        transaction that wrote verdicts, it stands only if that transaction commits."""
        kept, (self._horizon, self._state) = (self._horizon, self._state), (None, None)
        return kept


def _prune_verdict_logs(horizon: str) -> None:
    """Every delete and write below ``horizon`` is in what a reader just read (its feed's, or a
    listing taken after it): it needs them no more. A new reader lists, and so does one whose feed
    stood below the floor noted here (migration jobs 0025)."""
    with connection.cursor() as cursor:
        cursor.execute("WITH deletes AS (DELETE FROM colony_deleted_waits WHERE xid < %s::xid8), "
                       "writes AS (DELETE FROM colony_verdict_writers WHERE xid < %s::xid8) "
                       "INSERT INTO colony_feed_pruned AS pruned (feed, below) VALUES ('verdicts', %s::xid8) "
                       "ON CONFLICT (feed) DO UPDATE SET below = EXCLUDED.below "
                       "WHERE pruned.below < EXCLUDED.below",
                       [horizon, horizon, horizon])


_writer: tuple[int, str] | None = None


def writer() -> str:
    """This process's name among the scheduler processes that write verdicts (a forked child
    gets its own)."""
    global _writer
    if _writer is None or _writer[0] != os.getpid():
        _writer = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}")
    return _writer[1]


@contextmanager
def loop_writes_verdicts():
    """The scheduling loop's own writes of verdicts, which it keeps as written: left unstamped,
    the transaction noted as this process's."""
    with connection.cursor() as cursor:
        cursor.execute("WITH noted AS (INSERT INTO colony_verdict_writers (writer) VALUES (%s)) "
                       "SELECT set_config('colony.verdicts_by_loop', '1', true), "
                       "set_config('colony.loop_wrote_verdicts', '1', true)", [writer()])
    yield  # (an error aborts the transaction, and the setting with it)
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('colony.verdicts_by_loop', '', true)")
