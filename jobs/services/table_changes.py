"""Whether a table changed since a read of it, without a scan of it.

Database triggers (migration jobs 0021) keep, per watched table, a change mark that moves with
every committed write to it, by any path: the ORM, a bulk ``QuerySet.update``, raw SQL, the admin,
``psql``. A cycle that reads a mark equal to the one it read beside its last listing of the
table knows the listing would be the same again: the steady cycle need not scan 200,000 pending
jobs three times to find that nothing changed (about 1 us of PostgreSQL CPU a row, each scan).

PostgreSQL: a writing transaction moves its table's mark once, at commit (a deferred constraint
trigger, queued by the first row it writes), so the mark's row is locked only while the writer
commits, never across its other statements (no deadlock with the rows it writes next), and in one
of ``SLOTS`` rows picked by backend, so that writers on other connections do not queue behind one
row. The mark is every slot's last value from one sequence: it never comes back to a value it had.
A transaction that wrote the table reads no mark (None: its own writes are not counted until it
commits). SQLite: a row trigger counts each write at once (one writer at a time: no contention),
so a transaction's own writes move the mark it reads.

A watched table whose triggers are gone (SQLite remakes a table that a migration alters, and
drops its triggers with it) or disabled reads no mark either: its readers then scan it as
before, slower but never stale. What no trigger sees: a session with ``session_replication_role =
replica`` (``pg_restore --disable-triggers``, a logical replication subscriber) writing the tables
while a scheduler runs; the loop's snapshot check (every ``SNAPSHOT_CHECK_EVERY`` cycles, built
afresh) would then report the pending rows it kept as a divergence, and a restarted scheduler
reads everything again."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model

COUNTS = "colony_table_changes"
SLOTS = 16
# The triggers a watched table needs (PostgreSQL: the deferred row trigger and the one for
# TRUNCATE; SQLite: one per kind of write).
TRIGGERS = {"postgresql": ("colony_changes_row", "colony_changes_truncate"),
            "sqlite": ("colony_changes_insert", "colony_changes_update", "colony_changes_delete")}


def flag(table: str) -> str:
    """The transaction-local setting a PostgreSQL transaction that wrote ``table`` holds."""
    return f"colony.wrote_{table}"


def mark_sql(model: type[Model]) -> str:
    """A scalar SQL expression for ``model``'s table's change mark now (text; NULL where there is
    none to trust), to be read in the same statement as a listing of the table: one snapshot for both."""
    table = model._meta.db_table
    if connection.vendor == "postgresql":
        triggers = ", ".join(f"'{name}'" for name in TRIGGERS["postgresql"])
        return (f"(SELECT CASE WHEN current_setting('{flag(table)}', true) = '1' "
                f"OR (SELECT count(*) FROM pg_trigger WHERE tgrelid = '{table}'::regclass AND tgname IN ({triggers}) "
                f"AND tgenabled IN ('O', 'A')) < {len(TRIGGERS['postgresql'])} THEN NULL "
                f"ELSE (SELECT COALESCE(string_agg(slot::text || ':' || changed::text, ',' ORDER BY slot), '') "
                f"FROM {COUNTS} WHERE table_name = '{table}') END)")
    if connection.vendor == "sqlite":
        triggers = ", ".join(f"'{name}_{table}'" for name in TRIGGERS["sqlite"])
        return (f"(SELECT CASE WHEN (SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
                f"AND tbl_name = '{table}' AND name IN ({triggers})) < {len(TRIGGERS['sqlite'])} THEN NULL "
                f"ELSE (SELECT CAST(changed AS TEXT) FROM {COUNTS} WHERE table_name = '{table}') END)")
    return "NULL"


def written_here(model: type[Model]) -> bool:
    """Whether the transaction under way wrote ``model``'s table (PostgreSQL: its mark reads None
    until it commits). Rows it wrote inside a savepoint carry the savepoint's id as their version,
    which no comparison with the transaction's own id recognises."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s, true) = '1'", [flag(model._meta.db_table)])
        return bool(cursor.fetchone()[0])


def marks(models: Sequence[type[Model]]) -> list[str | None]:
    """The change marks of these models' tables now, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(map(mark_sql, models)))
        return list(cursor.fetchone())


class KeptWhileUnchanged:
    """A value read from some tables, kept while their change marks stand: :meth:`get` reads the
    marks (one small statement) and reads the value again only when one moved or cannot be trusted."""

    def __init__(self, *models: type[Model]):
        self.models = models
        self._marks: tuple[str | None, ...] = (None,)
        self._value = None

    def get(self, read):
        # (the marks read before the value: a write between the two moves the marks the next call reads)
        now = tuple(marks(self.models))
        if None not in now and now == self._marks:
            return self._value
        self._value = value = read()
        self._marks = now
        return value
