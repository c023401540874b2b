"""Change marks of the jobs', the stored verdicts', the allocations' and the nodes' tables
(jobs/services/table_changes.py): triggers that move a mark with every committed write, so that a
scheduling cycle finds that nothing changed without scanning the queue, and node health that no
job or node moved without reading every allocation and node. Not a model: Django's flush of a test database must
not empty the marks (a mark that came back to an earlier value would read as "unchanged")."""

from django.db import migrations

# (as jobs/services/table_changes.py reads them; spelt out here, as a migration must stay as it ran)
COUNTS = "colony_table_changes"
SLOTS = 16
TRIGGERS = {"postgresql": ("colony_changes_row", "colony_changes_truncate"),
            "sqlite": ("colony_changes_insert", "colony_changes_update", "colony_changes_delete")}
WATCHED = ("jobs_job", "jobs_jobwait", "jobs_allocation", "monitoring_node")


def flag(table: str) -> str:
    return f"colony.wrote_{table}"


POSTGRESQL = [
    f"CREATE SEQUENCE {COUNTS}_seq",
    f"CREATE TABLE {COUNTS} (table_name text NOT NULL, slot integer NOT NULL, changed bigint NOT NULL, "
    "PRIMARY KEY (table_name, slot))",
    # Called by the row trigger's WHEN for each row written, at once: true for the transaction's
    # first row of the table only, which alone queues the deferred count. The setting it leaves
    # tells the transaction's own reads that their table's mark does not count their writes yet.
    """CREATE FUNCTION colony_first_write(written text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('colony.wrote_' || written, true) = '1' THEN
        RETURN false;
    END IF;
    PERFORM set_config('colony.wrote_' || written, '1', true);
    RETURN true;
END $$""",
    f"""CREATE FUNCTION colony_count_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {COUNTS} AS counts (table_name, slot, changed)
    VALUES (TG_TABLE_NAME, pg_backend_pid() % {SLOTS}, nextval('{COUNTS}_seq'))
    ON CONFLICT (table_name, slot) DO UPDATE SET changed = EXCLUDED.changed;
    RETURN NULL;
END $$""",
]
for _table in WATCHED:
    _row, _truncate = TRIGGERS["postgresql"]
    POSTGRESQL += [
        # (WHEN is evaluated as each row is written, even for a deferred trigger: the rows after
        # the first queue nothing)
        f"CREATE CONSTRAINT TRIGGER {_row} AFTER INSERT OR UPDATE OR DELETE ON {_table} "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        f"WHEN (current_setting('{flag(_table)}', true) IS DISTINCT FROM '1' AND colony_first_write('{_table}')) "
        "EXECUTE FUNCTION colony_count_change()",
        f"CREATE TRIGGER {_truncate} AFTER TRUNCATE ON {_table} FOR EACH STATEMENT "
        "EXECUTE FUNCTION colony_count_change()",
    ]
POSTGRESQL_REVERSE = [
    *(f"DROP TRIGGER IF EXISTS {name} ON {table}" for table in WATCHED for name in TRIGGERS["postgresql"]),
    "DROP FUNCTION IF EXISTS colony_count_change()",
    "DROP FUNCTION IF EXISTS colony_first_write(text)",
    f"DROP TABLE IF EXISTS {COUNTS}",
    f"DROP SEQUENCE IF EXISTS {COUNTS}_seq",
]

# SQLite: one writer at a time, so each row written sets the mark at once, to a random 64-bit
# value rather than a count: a transaction rolled back would take a count back to a value that
# readers inside it may have seen.
SQLITE = [
    f"CREATE TABLE {COUNTS} (table_name text NOT NULL, slot integer NOT NULL, changed bigint NOT NULL, "
    "PRIMARY KEY (table_name, slot))",
    *(f"INSERT INTO {COUNTS} (table_name, slot, changed) VALUES ('{table}', 0, 0)" for table in WATCHED),
    *(f"CREATE TRIGGER {name}_{table} AFTER {kind} ON {table} FOR EACH ROW BEGIN "
      f"UPDATE {COUNTS} SET changed = random() WHERE table_name = '{table}'; END"
      for table in WATCHED for name, kind in zip(TRIGGERS["sqlite"], ("INSERT", "UPDATE", "DELETE"))),
]
SQLITE_REVERSE = [
    *(f"DROP TRIGGER IF EXISTS {name}_{table}" for table in WATCHED for name in TRIGGERS["sqlite"]),
    f"DROP TABLE IF EXISTS {COUNTS}",
]


def install(apps, schema_editor):
    for statement in {"postgresql": POSTGRESQL, "sqlite": SQLITE}.get(schema_editor.connection.vendor, ()):
        schema_editor.execute(statement, params=None)


def remove(apps, schema_editor):
    for statement in {"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}.get(
            schema_editor.connection.vendor, ()):
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0020_jobprofile_util_runs"),
        # (after the nodes' table is as it is: SQLite drops a table's triggers when it remakes it)
        ("monitoring", "0006_node_job_fences"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
