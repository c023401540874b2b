"""Verdicts are rewritten in place many times over their life: on PostgreSQL their pages keep
half their room free, so that an update stays on its page (a HOT update, no index entry)."""

from django.db import migrations, models


def leave_room(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_jobwait SET (fillfactor = 50)")


def pack(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_jobwait RESET (fillfactor)")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0017_job_wait"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobwait",
            name="first_eta_at",
            field=models.BigIntegerField(
                blank=True, help_text="The first start time predicted in this wait (eta_accuracy reads the first attempt's).",
                null=True),
        ),
        migrations.RunPython(leave_room, pack),
    ]
