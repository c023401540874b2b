"""A change mark for live allocations too (jobs/services/table_changes.py, migration 0021): node
health finds that no job moved between two checks without reading 8,000 allocations."""

from django.db import migrations

COUNTS = "colony_table_changes"
TABLE = "jobs_allocation"
ROW, TRUNCATE = "colony_changes_row", "colony_changes_truncate"
SQLITE_TRIGGERS = ("colony_changes_insert", "colony_changes_update", "colony_changes_delete")

POSTGRESQL = [
    # (the functions are 0021's)
    f"CREATE CONSTRAINT TRIGGER {ROW} AFTER INSERT OR UPDATE OR DELETE ON {TABLE} "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
    f"WHEN (current_setting('colony.wrote_{TABLE}', true) IS DISTINCT FROM '1' AND colony_first_write('{TABLE}')) "
    "EXECUTE FUNCTION colony_count_change()",
    f"CREATE TRIGGER {TRUNCATE} AFTER TRUNCATE ON {TABLE} FOR EACH STATEMENT EXECUTE FUNCTION colony_count_change()",
]
POSTGRESQL_REVERSE = [f"DROP TRIGGER IF EXISTS {name} ON {TABLE}" for name in (ROW, TRUNCATE)] + [
    f"DELETE FROM {COUNTS} WHERE table_name = '{TABLE}'"]

SQLITE = [
    f"INSERT INTO {COUNTS} (table_name, slot, changed) VALUES ('{TABLE}', 0, 0)",
    *(f"CREATE TRIGGER {name}_{TABLE} AFTER {kind} ON {TABLE} FOR EACH ROW BEGIN "
      f"UPDATE {COUNTS} SET changed = random() WHERE table_name = '{TABLE}'; END"
      for name, kind in zip(SQLITE_TRIGGERS, ("INSERT", "UPDATE", "DELETE"))),
]
SQLITE_REVERSE = [f"DROP TRIGGER IF EXISTS {name}_{TABLE}" for name in SQLITE_TRIGGERS] + [
    f"DELETE FROM {COUNTS} WHERE table_name = '{TABLE}'"]


def install(apps, schema_editor):
    for statement in {"postgresql": POSTGRESQL, "sqlite": SQLITE}.get(schema_editor.connection.vendor, ()):
        schema_editor.execute(statement, params=None)


def remove(apps, schema_editor):
    for statement in {"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}.get(
            schema_editor.connection.vendor, ()):
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_table_changes"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
