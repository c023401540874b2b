"""On PostgreSQL every job row carries the id of the transaction that last wrote it (``changed_xid``,
set by a trigger for every write, by any path), indexed, and the jobs table a mark that moves with
every statement deleting from it: a scheduling cycle reads the jobs written since its last read
(``jobs.services.job_feed``) instead of listing every pending job, so that the cycle after a few
jobs end costs the same at 200,000 pending as at 50,000. Not a model field: the database writes it
and only the feed reads it."""

from django.db import migrations

# (as jobs/services/job_feed.py reads them; spelt out here, as a migration must stay as it ran)
COUNTS = "colony_table_changes"
DELETED = "jobs_job:deleted"

POSTGRESQL = [
    "ALTER TABLE jobs_job ADD COLUMN changed_xid xid8",
    """CREATE FUNCTION colony_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END $$""",
    "CREATE TRIGGER colony_stamp_xid BEFORE INSERT OR UPDATE ON jobs_job FOR EACH ROW "
    "EXECUTE FUNCTION colony_stamp_xid()",
    # (built beside the writers, not locking them out for the minutes a large table takes)
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_job_changed_xid ON jobs_job (changed_xid)",
    # A row deleted leaves no row to find by its stamp: the feed's reader lists the queue again
    # whenever this mark moved (a delete of jobs is rare: an operator's clean-up).
    f"""CREATE FUNCTION colony_count_job_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {COUNTS} AS counts (table_name, slot, changed)
    VALUES ('{DELETED}', 0, nextval('{COUNTS}_seq'))
    ON CONFLICT (table_name, slot) DO UPDATE SET changed = EXCLUDED.changed;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER colony_count_job_delete AFTER DELETE OR TRUNCATE ON jobs_job FOR EACH STATEMENT "
    "EXECUTE FUNCTION colony_count_job_delete()",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS colony_count_job_delete ON jobs_job",
    "DROP FUNCTION IF EXISTS colony_count_job_delete()",
    "DROP TRIGGER IF EXISTS colony_stamp_xid ON jobs_job",
    "DROP FUNCTION IF EXISTS colony_stamp_xid()",
    "DROP INDEX IF EXISTS jobs_job_changed_xid",
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
