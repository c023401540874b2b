"""A change mark for the GPUs' table too (jobs/services/table_changes.py, as 0021 made them for the
jobs', the verdicts', the allocations' and the nodes' tables): a scheduling cycle then keeps the
nodes' and GPUs' rows while neither table was written (a node registers or changes health a few
times a day; a cycle read 1,024 + 8,192 rows every 2 s to find them the same)."""

from django.db import migrations

# (as 0021 and jobs/services/table_changes.py have them; spelt out here, as a migration must stay as it ran)
COUNTS = "colony_table_changes"
TRIGGERS = {"postgresql": ("colony_changes_row", "colony_changes_truncate"),
            "sqlite": ("colony_changes_insert", "colony_changes_update", "colony_changes_delete")}
TABLE = "monitoring_gpu"
FLAG = f"colony.wrote_{TABLE}"

_row, _truncate = TRIGGERS["postgresql"]
POSTGRESQL = [
    f"CREATE CONSTRAINT TRIGGER {_row} AFTER INSERT OR UPDATE OR DELETE ON {TABLE} "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
    f"WHEN (current_setting('{FLAG}', true) IS DISTINCT FROM '1' AND colony_first_write('{TABLE}')) "
    "EXECUTE FUNCTION colony_count_change()",
    f"CREATE TRIGGER {_truncate} AFTER TRUNCATE ON {TABLE} FOR EACH STATEMENT EXECUTE FUNCTION colony_count_change()",
]
POSTGRESQL_REVERSE = [f"DROP TRIGGER IF EXISTS {name} ON {TABLE}" for name in TRIGGERS["postgresql"]]
SQLITE = [
    f"INSERT INTO {COUNTS} (table_name, slot, changed) VALUES ('{TABLE}', 0, 0)",
    *(f"CREATE TRIGGER {name}_{TABLE} AFTER {kind} ON {TABLE} FOR EACH ROW BEGIN "
      f"UPDATE {COUNTS} SET changed = random() WHERE table_name = '{TABLE}'; END"
      for name, kind in zip(TRIGGERS["sqlite"], ("INSERT", "UPDATE", "DELETE"))),
]
SQLITE_REVERSE = [
    *(f"DROP TRIGGER IF EXISTS {name}_{TABLE}" for name in TRIGGERS["sqlite"]),
    f"DELETE FROM {COUNTS} WHERE table_name = '{TABLE}'",
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
        ("jobs", "0025_verdict_feed_pruned_floor"),
        # (after the GPUs' table is as it is: SQLite drops a table's triggers when it remakes it)
        ("monitoring", "0006_node_job_fences"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
