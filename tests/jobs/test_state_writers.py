"""One writer of ``Job.state`` (jobs/state_guard.py): every kind of write, from any package, is
refused unless it comes from the jobs/services/lifecycle/ package; what only reads or filters on the state,
creates a PENDING job or saves a job's other fields goes through.

Each probe is a small module written to a temporary folder and imported under a name in one of
the project's packages, then run against a real job: the guard must refuse it and the job must
keep its state. The lifecycle's own writes are driven by tests/jobs/test_lifecycle.py and every
test that moves a job through it.
"""

from __future__ import annotations

import importlib.util

import pytest
from django.db import transaction

from jobs.choices import JobState
from jobs.models import Job
from jobs.state_guard import StateWriteRefused, writes_state
from tests.factories import JobFactory

HEADER = """
from django.db import connection
from django.db.models import Case, Value, When

from jobs.models import Job
"""

WRITES = {
    "update": 'Job.objects.filter(pk=job.pk).update(state="RUNNING")',
    "update_dict": 'Job.objects.filter(pk=job.pk).update(**{"state": "RUNNING"})',
    "update_case": 'Job.objects.filter(pk=job.pk).update(state=Case(When(pk=job.pk, then=Value("RUNNING"))))',
    "update_among_others": 'Job.objects.filter(pk=job.pk).update(priority=3, state="RUNNING")',
    "setattr_update_fields": 'setattr(job, "state", "RUNNING"); job.save(update_fields=["state"])',
    "setattr_whole_save": 'setattr(job, "state", "RUNNING"); job.save()',
    "attribute_whole_save": 'job.state = "RUNNING"; job.save()',
    "update_or_create": 'Job.objects.update_or_create(pk=job.pk, defaults={"state": "RUNNING"})',
    "bulk_update": 'job.state = "RUNNING"; Job.objects.bulk_update([job], ["state"])',
    "bulk_update_fields_kw": 'job.state = "RUNNING"; Job.objects.bulk_update([job], fields=("state", "priority"))',
    "create": ('Job.objects.create(tenant=job.tenant, owner=job.owner, name="x", command=["true"], gpus=1, '
               'state="RUNNING")'),
    "bulk_create": ('Job.objects.bulk_create([Job(tenant=job.tenant, owner=job.owner, name="x", command=["true"], '
                    'gpus=1), Job(tenant=job.tenant, owner=job.owner, name="y", command=["true"], gpus=1, '
                    'state="SUCCEEDED")])'),
    "raw_sql": ('with connection.cursor() as cursor:\n'
                '        cursor.execute("UPDATE jobs_job SET state = %s WHERE id = %s", ["RUNNING", job.pk])'),
    "raw_sql_quoted": ('with connection.cursor() as cursor:\n'
                       '        cursor.execute(\'update "jobs_job" set priority = 1, "state"=%s where id = %s\', '
                       '["RUNNING", job.pk])'),
    "raw_sql_insert": ('with connection.cursor() as cursor:\n'
                       '        cursor.execute("INSERT INTO jobs_job (tenant_id, owner_id, name, state) '
                       'VALUES (1, 1, \'x\', \'RUNNING\')")'),
}

HARMLESS = {
    "filter_on_state": 'Job.objects.filter(pk=job.pk, state="PENDING").update(priority=2)',
    "other_fields_saved": "job.priority = 2; job.save()",
    "other_fields_listed": 'job.priority = 2; job.save(update_fields=["priority"])',
    "create_pending": 'Job.objects.create(tenant=job.tenant, owner=job.owner, name="x", command=["true"], gpus=1)',
    "raw_sql_where": ('with connection.cursor() as cursor:\n'
                      '        cursor.execute("UPDATE jobs_job SET priority = 2 WHERE id = %s AND state = %s", '
                      '[job.pk, "PENDING"])'),
}

# Where the probe pretends to live: every package of the project, the lifecycle's own included,
# and a neighbour whose name only begins like the lifecycle's.
PACKAGES = ["agents", "monitoring.services", "cluster_ui", "jobs.services", "jobs.api", "bench",
            "jobs.services.lifecycle_helpers"]


def probe(tmp_path, package: str, kind: str, code: str):
    """A module ``<package>.state_probe_<kind>`` whose ``run(job)`` does ``code``."""
    path = tmp_path / f"state_probe_{kind}.py"
    path.write_text(HEADER + f"\n\ndef run(job):\n    {code}\n")
    spec = importlib.util.spec_from_file_location(f"{package}.state_probe_{kind}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def job(alice, vision):
    return JobFactory(tenant=vision, owner=alice, priority=0)


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("kind", sorted(WRITES))
def test_every_kind_of_state_write_from_any_package_is_refused(kind, package, job, tmp_path):
    module = probe(tmp_path, package, kind, WRITES[kind])
    jobs_before = Job.objects.count()
    with pytest.raises(StateWriteRefused, match=f"{package}.state_probe_{kind}"):
        with transaction.atomic():  # (the refused statement spoils the transaction it was in)
            module.run(job)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, stored.priority) == (JobState.PENDING, 0)
    assert Job.objects.count() == jobs_before


@pytest.mark.parametrize("kind", sorted(HARMLESS))
def test_reads_filters_pending_jobs_and_other_fields_go_through(kind, job, tmp_path):
    module = probe(tmp_path, "monitoring.services", kind, HARMLESS[kind])
    module.run(job)
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_the_lifecycle_writes(job):
    from jobs.services import lifecycle

    assert lifecycle.begin_cancel(job.pk) == JobState.CANCELLED
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


@pytest.mark.parametrize("kind", ["update", "bulk_update", "raw_sql"])
def test_any_module_of_the_lifecycle_package_writes(kind, job, tmp_path):
    module = probe(tmp_path, "jobs.services.lifecycle", kind, WRITES[kind])
    module.run(job)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_stale_job_saved_elsewhere_keeps_the_state_the_lifecycle_gave_it(job, tmp_path):
    """A whole-row save outside the lifecycle never writes the state column: an object read
    before a cancel cannot put the job back in the queue by saving its priority."""
    from jobs.services import lifecycle

    stale = Job.objects.get(pk=job.pk)
    lifecycle.begin_cancel(job.pk)
    module = probe(tmp_path, "jobs.api", "stale_save", "job.priority = 2; job.save()")
    with pytest.raises(StateWriteRefused), transaction.atomic():
        module.run(stale)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


@pytest.mark.parametrize("sql, params, writes", [
    ('UPDATE "jobs_job" SET "state" = %s, "finished_at" = %s WHERE "jobs_job"."id" = %s', ["X", None, 1], True),
    ('UPDATE "jobs_job" SET "priority" = %s WHERE ("jobs_job"."id" = %s AND "jobs_job"."state" = %s)', [1, 1, "P"],
     False),
    ('UPDATE "jobs_allocation" SET duty_cycle = 1 FROM "jobs_job" AS job WHERE job.state = ANY(%s)', [["X"]], False),
    ('INSERT INTO "jobs_job" ("name", "state") VALUES (%s, %s), (%s, %s)', ["a", "PENDING", "b", "PENDING"], False),
    ('INSERT INTO "jobs_job" ("name", "state") VALUES (%s, %s), (%s, %s)', ["a", "PENDING", "b", "RUNNING"], True),
    ('INSERT INTO "jobs_job" ("name", "state") SELECT * FROM UNNEST(%s, %s)', [["a", "b"], ["PENDING", "FAILED"]],
     True),
    ('SELECT "jobs_job"."state" FROM "jobs_job"', [], False),
])
def test_what_counts_as_a_state_write(sql, params, writes):
    assert writes_state(sql, params) is writes


def test_an_operator_moves_a_job_by_the_admins_actions_not_its_form(client, operator, job):
    client.force_login(operator)
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    assert "state" not in page.context["adminform"].form.fields
    assert "cancel_jobs" in client.get("/admin/jobs/job/").content.decode()
