"""On PostgreSQL a verdict's reason also as a 64-bit digest of its text (``reason_digest``), which the
database keeps for every write, by any path: a scheduler that starts reads 47,000 digests instead of
47,000 reasons as text (``apply._queue``), and the text of each distinct reason once. Not a model
field: the expression is PostgreSQL's own, and no code writes the column."""

from django.db import migrations


def add(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # (a hash of the text, not jsonb_hash_extended: that one hashes 1 and 1.0 alike, and a
        # verdict worded otherwise must read as another)
        schema_editor.execute("ALTER TABLE jobs_jobwait ADD COLUMN reason_digest bigint "
                              "GENERATED ALWAYS AS (hashtextextended(reason::text, 0)) STORED")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_jobwait DROP COLUMN reason_digest")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_table_changes"),
    ]

    operations = [
        migrations.RunPython(add, drop),
    ]
