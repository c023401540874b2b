"""How far the verdicts' feed logs were pruned (PostgreSQL; jobs.services.job_feed).

A reader that advances prunes the log of deleted verdicts and of the scheduler processes that wrote
verdicts below its new horizon. Another process whose feed stood below that point (a scheduler
that led before, and leads again) would have found in those rows what the others wrote since:
with them gone it kept verdicts another leader had rewritten, and "why pending" showed the old
reason. The floor is noted here, and a feed that stood below it lists instead."""

from django.db import migrations

PRUNED = "colony_feed_pruned"


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"CREATE TABLE IF NOT EXISTS {PRUNED} (feed text PRIMARY KEY, below xid8 NOT NULL)",
                              params=None)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TABLE IF EXISTS {PRUNED}", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0024_verdict_change_feed"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
