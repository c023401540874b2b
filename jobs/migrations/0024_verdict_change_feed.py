"""On PostgreSQL the stored verdicts (``jobs_jobwait``) get a feed as the jobs did in 0023: every row
written by anyone but the scheduling loop's own verdict writer carries the id of its writing
transaction (``changed_xid``, indexed), every row deleted is logged with the id of the transaction
deleting it (``colony_deleted_waits``), and a TRUNCATE moves a mark. The loop then reads, after a
cycle that wrote verdicts, only what others wrote or deleted since (``jobs.services.job_feed``)
instead of listing every stored verdict. Its own writes, which it keeps as written, are left
unstamped (the transaction-local ``colony.verdicts_by_loop``), each such transaction noted with
its writer (``colony_verdict_writers``): a stamp would cost each of the 47,000 verdicts a first
cycle writes a trigger call and an index entry (no HOT update)."""

from django.db import migrations

COUNTS = "colony_table_changes"
TRUNCATED = "jobs_jobwait:truncated"
LOG = "colony_deleted_waits"
WRITERS = "colony_verdict_writers"

POSTGRESQL = [
    "ALTER TABLE jobs_jobwait ADD COLUMN IF NOT EXISTS changed_xid xid8",
    # (the function of 0023: it stamps any table with the column)
    "DROP TRIGGER IF EXISTS colony_stamp_xid ON jobs_jobwait",
    "CREATE TRIGGER colony_stamp_xid BEFORE INSERT OR UPDATE ON jobs_jobwait FOR EACH ROW "
    "WHEN (current_setting('colony.verdicts_by_loop', true) IS DISTINCT FROM '1') "
    "EXECUTE FUNCTION colony_stamp_xid()",
    f"CREATE TABLE IF NOT EXISTS {LOG} (id bigserial PRIMARY KEY, job_id bigint NOT NULL, "
    "xid xid8 NOT NULL DEFAULT pg_current_xact_id())",
    f"CREATE INDEX IF NOT EXISTS {LOG}_xid ON {LOG} (xid)",
    # Which scheduler process wrote verdicts unstamped in which transaction: another one's (a lease
    # that moved and came back) makes a reader list the verdicts, since only their writer kept them.
    f"CREATE TABLE IF NOT EXISTS {WRITERS} (id bigserial PRIMARY KEY, writer text NOT NULL, "
    "xid xid8 NOT NULL DEFAULT pg_current_xact_id())",
    f"CREATE INDEX IF NOT EXISTS {WRITERS}_xid ON {WRITERS} (xid)",
    f"""CREATE OR REPLACE FUNCTION colony_log_deleted_wait() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {LOG} (job_id) VALUES (OLD.job_id);
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS colony_log_deleted_wait ON jobs_jobwait",
    "CREATE TRIGGER colony_log_deleted_wait AFTER DELETE ON jobs_jobwait FOR EACH ROW "
    "EXECUTE FUNCTION colony_log_deleted_wait()",
    f"""CREATE OR REPLACE FUNCTION colony_count_wait_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {COUNTS} AS counts (table_name, slot, changed)
    VALUES ('{TRUNCATED}', 0, nextval('{COUNTS}_seq'))
    ON CONFLICT (table_name, slot) DO UPDATE SET changed = EXCLUDED.changed;
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS colony_count_wait_truncate ON jobs_jobwait",
    "CREATE TRIGGER colony_count_wait_truncate AFTER TRUNCATE ON jobs_jobwait FOR EACH STATEMENT "
    "EXECUTE FUNCTION colony_count_wait_truncate()",
    *(f"ALTER TABLE jobs_jobwait ENABLE ALWAYS TRIGGER {name}"
      for name in ("colony_stamp_xid", "colony_log_deleted_wait", "colony_count_wait_truncate")),
    "DROP INDEX CONCURRENTLY IF EXISTS jobs_jobwait_changed_xid",  # (one a failed build left invalid)
    "CREATE INDEX CONCURRENTLY jobs_jobwait_changed_xid ON jobs_jobwait (changed_xid)",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS colony_count_wait_truncate ON jobs_jobwait",
    "DROP FUNCTION IF EXISTS colony_count_wait_truncate()",
    "DROP TRIGGER IF EXISTS colony_log_deleted_wait ON jobs_jobwait",
    "DROP FUNCTION IF EXISTS colony_log_deleted_wait()",
    f"DROP TABLE IF EXISTS {LOG}",
    f"DROP TABLE IF EXISTS {WRITERS}",
    "DROP TRIGGER IF EXISTS colony_stamp_xid ON jobs_jobwait",
    "DROP INDEX CONCURRENTLY IF EXISTS jobs_jobwait_changed_xid",
    "ALTER TABLE jobs_jobwait DROP COLUMN IF EXISTS changed_xid",
    f"DELETE FROM {COUNTS} WHERE table_name = '{TRUNCATED}'",
]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRESQL:
            schema_editor.execute(statement, params=None)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRESQL_REVERSE:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    atomic = False  # (CREATE INDEX CONCURRENTLY runs outside a transaction)

    dependencies = [
        ("jobs", "0023_job_change_feed"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
