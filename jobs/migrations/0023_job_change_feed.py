"""On PostgreSQL every job row carries the id of the transaction that last wrote it (``changed_xid``,
set by a trigger for every write, by any path, in every session), indexed, and the jobs table a
mark that moves with every transaction deleting from it: a scheduling cycle reads the jobs written since its last read
(``jobs.services.job_feed``) instead of listing every pending job, so that the cycle after a few
jobs end costs the same at 200,000 pending as at 50,000. Not a model field: the database writes it
and only the feed reads it."""

from django.db import migrations

# (as jobs/services/job_feed.py reads them; spelt out here, as a migration must stay as it ran)
COUNTS = "colony_table_changes"
DELETED = "jobs_job:deleted"

SLOTS = 16

# Each statement can run again after a failure part way (the migration is not atomic: the index is
# built beside the writers, not locking them out for the minutes a large table takes).
POSTGRESQL = [
    "ALTER TABLE jobs_job ADD COLUMN IF NOT EXISTS changed_xid xid8",
    """CREATE OR REPLACE FUNCTION colony_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END $$""",
    "DROP TRIGGER IF EXISTS colony_stamp_xid ON jobs_job",
    "CREATE TRIGGER colony_stamp_xid BEFORE INSERT OR UPDATE ON jobs_job FOR EACH ROW "
    "EXECUTE FUNCTION colony_stamp_xid()",
    # A row deleted leaves no row to find by its stamp: the feed's reader lists the queue again
    # whenever this mark moved (a delete of jobs is rare: an operator's clean-up). Moved once per
    # deleting transaction, at its commit, in a slot picked by backend, as the change marks of
    # migration 0021 are: deleting transactions neither queue behind one row nor hold it across
    # their statements.
    f"""CREATE OR REPLACE FUNCTION colony_count_job_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {COUNTS} AS counts (table_name, slot, changed)
    VALUES ('{DELETED}', pg_backend_pid() % {SLOTS}, nextval('{COUNTS}_seq'))
    ON CONFLICT (table_name, slot) DO UPDATE SET changed = EXCLUDED.changed;
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS colony_count_job_delete ON jobs_job",
    "CREATE CONSTRAINT TRIGGER colony_count_job_delete AFTER DELETE ON jobs_job "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
    "WHEN (current_setting('colony.wrote_jobs_job_deleted', true) IS DISTINCT FROM '1' "
    "AND colony_first_write('jobs_job_deleted')) EXECUTE FUNCTION colony_count_job_delete()",
    "DROP TRIGGER IF EXISTS colony_count_job_truncate ON jobs_job",
    "CREATE TRIGGER colony_count_job_truncate AFTER TRUNCATE ON jobs_job FOR EACH STATEMENT "
    "EXECUTE FUNCTION colony_count_job_delete()",
    # Fired in every session, a replica's too (session_replication_role = replica skips the
    # ordinary triggers): a write no stamp records would never be read again.
    *(f"ALTER TABLE jobs_job ENABLE ALWAYS TRIGGER {name}"
      for name in ("colony_stamp_xid", "colony_count_job_delete", "colony_count_job_truncate")),
    "DROP INDEX CONCURRENTLY IF EXISTS jobs_job_changed_xid",  # (one a failed build left invalid)
    "CREATE INDEX CONCURRENTLY jobs_job_changed_xid ON jobs_job (changed_xid)",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS colony_count_job_truncate ON jobs_job",
    "DROP TRIGGER IF EXISTS colony_count_job_delete ON jobs_job",
    "DROP FUNCTION IF EXISTS colony_count_job_delete()",
    "DROP TRIGGER IF EXISTS colony_stamp_xid ON jobs_job",
    "DROP FUNCTION IF EXISTS colony_stamp_xid()",
    "DROP INDEX CONCURRENTLY IF EXISTS jobs_job_changed_xid",
    "ALTER TABLE jobs_job DROP COLUMN IF EXISTS changed_xid",
    f"DELETE FROM {COUNTS} WHERE table_name = '{DELETED}'",
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
        ("jobs", "0022_job_wait_reason_digest"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
