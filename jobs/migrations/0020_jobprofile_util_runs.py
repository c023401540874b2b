from django.db import migrations, models
from django.db.models import F


def count_existing(apps, schema_editor):
    # Before this field every run was counted for the mean: a profile with a mean had it from
    # all its runs as far as anyone can tell now.
    JobProfile = apps.get_model("jobs", "JobProfile")
    JobProfile.objects.filter(mean_util__isnull=False).update(util_runs=F("runs"))


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0019_job_promise"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobprofile",
            name="util_runs",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(count_existing, migrations.RunPython.noop),
    ]
