"""Waiting jobs' verdicts move from the wide job row to a narrow table (``JobWait``): a cycle
rewrites most of them, and a job row costs five times as much to rewrite. Verdicts of jobs
pending or being preempted now are carried over, with their ETA and first promised start."""

import django.db.models.deletion
from django.db import migrations, models


def carry_over(apps, schema_editor):
    Job, JobWait = apps.get_model("jobs", "Job"), apps.get_model("jobs", "JobWait")
    rows = []
    for job_id, reason, first in (Job.objects.filter(state__in=("PENDING", "PREEMPTING"), pending_reason__isnull=False)
                                  .values_list("id", "pending_reason", "eta_first_at").iterator()):
        if not isinstance(reason, dict):
            continue
        eta_at = reason.pop("eta_at", None)
        rows.append(JobWait(job_id=job_id, reason=reason,
                            eta_at=int(eta_at) if isinstance(eta_at, (int, float)) and not isinstance(eta_at, bool) else None,
                            first_eta_at=int(first.timestamp()) if first else None))
    JobWait.objects.bulk_create(rows, batch_size=2000)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0016_pending_by_owner'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobWait',
            fields=[
                ('job', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='wait', serialize=False, to='jobs.job')),
                ('reason', models.JSONField(help_text='{code, message, details}.')),
                ('eta_at', models.BigIntegerField(blank=True, help_text='Unix time it may start, when known.', null=True)),
                ('first_eta_at', models.BigIntegerField(blank=True, help_text='The first start time predicted for it (first attempt only).', null=True)),
            ],
        ),
        migrations.RunPython(carry_over, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name='job',
            name='eta_first_at',
        ),
        migrations.RemoveField(
            model_name='job',
            name='pending_reason',
        ),
    ]
