"""Rows the scheduler inserts in bulk (allocations, timeline events) and the id lists it filters
by read back exactly as given, whatever text they hold: quotes, backslashes, braces, commas,
the word NULL, non-ASCII, empty strings and missing values."""

from datetime import timedelta

import pytest
from django.db import DataError, connection
from django.utils import timezone

from jobs.choices import JobEventKind
from jobs.models import Allocation, Job, JobEvent
from jobs.services.bulk_rows import IDS_AS_ONE_PARAMETER, ids_in, insert_rows
from tests.factories import GpuFactory, JobFactory, NodeFactory

AWKWARD = ['He said "run", then left', "C:\\temp\\{x}", "a,b,{c}", "NULL", "", "naïve – ok ✓", "' OR 1=1 --",
           "\\\"", "trailing \\"]


def test_timeline_rows_read_back_as_written(db):
    job = JobFactory()
    at = timezone.now() - timedelta(seconds=3)
    rows = [(job.pk, 1, str(JobEventKind.PLACED), at + timedelta(microseconds=i), text[:63], text)
            for i, text in enumerate(AWKWARD)]

    insert_rows(JobEvent, ("job_id", "attempt", "kind", "at", "node", "message"), rows)

    stored = list(JobEvent.objects.filter(job=job, kind=JobEventKind.PLACED).order_by("at")
                  .values_list("job_id", "attempt", "kind", "at", "node", "message"))
    assert stored == rows


def test_allocation_rows_keep_numbers_and_missing_values(db):
    job, node = JobFactory(), NodeFactory()
    gpus = [GpuFactory(node=node, index=i) for i in range(3)]
    now = timezone.now()
    rows = [(job.pk, gpus[0].pk, 0, 1000, None, 1.0, 1, now),
            (job.pk, gpus[1].pk, 1, 250, 20480, 0.125, 1, now),
            (job.pk, gpus[2].pk, 2, 500, 1, 1e-3, 1, now)]
    columns = ("job_id", "gpu_id", "rank", "gpu_milli", "memory_limit_mib", "duty_cycle", "attempt", "created_at")

    insert_rows(Allocation, columns, rows)

    # (created_at aside: on SQLite, bulk_create stamps its own)
    assert sorted(Allocation.objects.filter(job=job).values_list(*columns[:-1])) == sorted(row[:-1] for row in rows)


def test_a_long_id_list_filters_like_a_short_one(db):
    jobs = [JobFactory() for _ in range(3)]
    wanted = [jobs[0].pk, jobs[2].pk] + [10**12 + i for i in range(IDS_AS_ONE_PARAMETER)]  # most match nothing

    assert set(Job.objects.filter(pk__in=ids_in(wanted)).values_list("pk", flat=True)) == {jobs[0].pk, jobs[2].pk}
    assert set(Job.objects.filter(pk__in=ids_in(wanted[:2])).values_list("pk", flat=True)) == {jobs[0].pk, jobs[2].pk}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite does not enforce a column's length")
def test_text_longer_than_its_column_is_refused_not_cut(db):
    job = JobFactory()
    with pytest.raises(DataError):
        insert_rows(JobEvent, ("job_id", "attempt", "kind", "at", "node", "message"),
                    [(job.pk, 1, str(JobEventKind.PLACED), timezone.now(), "n" * 64, "fits")])
