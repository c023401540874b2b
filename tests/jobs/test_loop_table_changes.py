"""A scheduling cycle in which nothing was written to the queue does not scan it (the tables' change
marks say so), and any write to it, by whatever path, is still seen by the next cycle: an ORM
save, a bulk ``QuerySet.update``, raw SQL from another connection."""

import re

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agents import protocol
from jobs.choices import JobState
from jobs.models import Job, JobWait
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.table_changes import marks
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


@pytest.fixture
def cluster(transactional_db, redis_client, live_redis):
    """Two GPUs on one node and a tenant that may use them; every write commits on its own, as the
    loop and the API do (inside a test's one transaction the loop must list every time)."""
    node = NodeFactory(name="n1")
    for index in range(2):
        GpuFactory(node=node, index=index)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=2)


def queue_scans(captured) -> list[str]:
    """Statements that read the pending queue or the stored verdicts: whole, or what was written to
    them since the last read (``jobs.services.job_feed``)."""
    return [q["sql"] for q in captured.captured_queries
            if re.search(r'FROM "jobs_jobwait"', q["sql"]) or "changed_xid >=" in q["sql"]
            or (re.search(r'FROM "jobs_job"(?!\w)', q["sql"]) and f"'{JobState.PENDING.value}'" in q["sql"])]


def cycle():
    with CaptureQueriesContext(connection) as captured:
        result = run_scheduling_cycle()
    assert result.ran
    return result, queue_scans(captured)


def settle():
    """Cycles until one finds nothing written since the one before (its own writes included)."""
    for _ in range(4):
        result, scans = cycle()
        if not scans:
            return result
    raise AssertionError("the loop kept scanning a queue that nothing wrote to")


def test_a_steady_cycle_does_not_scan_the_queue_and_each_kind_of_write_is_seen_next_cycle(cluster):
    too_big = JobFactory(tenant=cluster, gpus=4)  # waits: no node has 4 GPUs
    waiting = [JobFactory(tenant=cluster, gpus=3) for _ in range(3)]
    first, scans = cycle()
    assert scans and first.pending == 4 and first.placed == 0
    assert settle().pending == 4

    # A bulk update (no save(), no signal) makes one fit: the next cycle places it.
    Job.objects.filter(pk=too_big.pk).update(gpus=1)
    result, scans = cycle()
    assert scans and result.placed == 1 and Job.objects.get(pk=too_big.pk).state == JobState.PLACED
    assert settle().pending == 3

    # A bulk update cancels one: the next cycle no longer counts it waiting.
    Job.objects.filter(pk=waiting[0].pk).update(state=JobState.CANCELLED)
    result, scans = cycle()
    assert scans and result.pending == 2
    assert settle().pending == 2

    # A submission (an ORM save): the next cycle gives it its verdict.
    submitted = JobFactory(tenant=cluster, gpus=3)
    result, scans = cycle()
    assert scans and result.pending == 3
    assert JobWait.objects.filter(job=submitted).exists()
    assert settle().pending == 3


def test_a_verdict_someone_else_deletes_is_written_again_next_cycle(cluster):
    job = JobFactory(tenant=cluster, gpus=4)
    cycle()
    settle()
    reason = Job.objects.select_related("wait").get(pk=job.pk).pending_reason
    assert reason
    JobWait.objects.filter(job=job).delete()
    _, scans = cycle()
    assert scans and Job.objects.select_related("wait").get(pk=job.pk).pending_reason == reason


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a second connection to the same database")
def test_raw_sql_committed_on_another_connection_is_seen_next_cycle(cluster):
    job = JobFactory(tenant=cluster, gpus=4)
    cycle()
    assert settle().placed == 0
    settings = connection.settings_dict
    with psycopg.connect(dbname=settings["NAME"], user=settings["USER"], password=settings["PASSWORD"] or None,
                         host=settings["HOST"] or None, port=settings["PORT"] or None, autocommit=True) as other:
        other.execute("UPDATE jobs_job SET gpus = 2 WHERE id = %s", [job.pk])
    result, scans = cycle()
    assert scans and result.placed == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL counts a transaction's writes at commit")
def test_a_transaction_that_wrote_the_queue_reads_no_mark_until_it_commits(cluster):
    JobFactory(tenant=cluster)
    committed = marks([Job, JobWait])
    assert None not in committed
    with transaction.atomic():
        assert marks([Job, JobWait]) == committed  # nothing written yet
        Job.objects.filter(state=JobState.PENDING).update(priority=1)
        assert marks([Job, JobWait]) == [None, committed[1]]
        JobFactory(tenant=cluster)  # (a second write: still one count at commit)
    after = marks([Job, JobWait])
    assert after[0] not in (None, committed[0]) and after[1] == committed[1]
    Job.objects.filter(pk=-1).update(priority=2)  # no row written: no change
    assert marks([Job, JobWait]) == after


def test_a_queue_whose_change_triggers_are_gone_is_scanned_every_cycle(cluster):
    """SQLite drops a table's triggers when a migration remakes the table; a trigger can be dropped
    or disabled by hand on PostgreSQL: the loop then scans as before, never trusting a dead mark."""
    job = JobFactory(tenant=cluster, gpus=4)
    cycle()
    settle()
    postgresql = connection.vendor == "postgresql"
    off, on = (("ALTER TABLE jobs_job DISABLE TRIGGER colony_changes_row",
                "ALTER TABLE jobs_job ENABLE TRIGGER colony_changes_row") if postgresql else
               ("DROP TRIGGER colony_changes_update_jobs_job",
                "CREATE TRIGGER colony_changes_update_jobs_job AFTER UPDATE ON jobs_job FOR EACH ROW BEGIN "
                "UPDATE colony_table_changes SET changed = random() WHERE table_name = 'jobs_job'; END"))
    with connection.cursor() as cursor:
        cursor.execute(off)
    try:
        assert marks([Job])[0] is None
        _, scans = cycle()
        assert scans
        Job.objects.filter(pk=job.pk).update(gpus=1)
        result, scans = cycle()
        assert scans and result.placed == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(on)
    assert marks([Job])[0] is not None


def allocation_reads(captured) -> list[str]:
    """The statements that read the live allocations again: every row (SQLite), or their listing by
    row version (PostgreSQL: then only the rows that changed are read)."""
    return [q["sql"] for q in captured.captured_queries
            if re.search(r'FROM "jobs_allocation"', q["sql"]) and "released_at" in q["sql"]
            and ('"job_id", "jobs_allocation"."gpu_id"' in q["sql"] or 'string_agg("jobs_allocation".id' in q["sql"])]


def test_running_jobs_are_read_again_only_after_an_allocation_or_a_job_is_written(cluster):
    """A steady cycle does not read every live allocation again; a GPU freed behind the loop's back
    (a bulk update, as an operator's script would) is seen by the next cycle, which places the
    job that waited for it."""
    from jobs.models import Allocation

    holder = JobFactory(tenant=cluster, gpus=2)
    waiting = JobFactory(tenant=cluster, gpus=2)
    first, _ = cycle()
    assert first.placed == 1
    Job.objects.filter(pk=holder.pk).update(state=JobState.RUNNING)
    settle()
    with CaptureQueriesContext(connection) as captured:
        steady, _ = cycle()
    assert steady.placed == 0 and allocation_reads(captured) == []

    from django.utils import timezone

    Allocation.objects.filter(job=holder).update(released_at=timezone.now())
    Job.objects.filter(pk=holder.pk).update(state=JobState.SUCCEEDED)
    with CaptureQueriesContext(connection) as captured:
        freed, _ = cycle()
    assert allocation_reads(captured) and freed.placed == 1
    assert Job.objects.get(pk=waiting.pk).state == JobState.PLACED


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's")
def test_a_cycle_after_a_submission_tells_it_why_it_waits_without_listing_the_queue_again(cluster):
    """The apply learns which jobs are pending and reserved from the snapshot the cycle decided on
    (less the jobs it placed), not from a second listing of the queue."""
    JobFactory(tenant=cluster, gpus=4)  # waits: no node has 4 GPUs
    cycle()
    settle()
    submitted = JobFactory(tenant=cluster, gpus=4)
    with CaptureQueriesContext(connection) as captured:
        assert run_scheduling_cycle().ran
    assert not [q for q in captured.captured_queries if "reserved_since IS NOT NULL" in q["sql"]]
    assert JobWait.objects.get(job_id=submitted.pk).reason["code"]


def inventory_reads(captured) -> list[str]:
    """The statements that read the nodes' or the GPUs' rows."""
    return [q["sql"] for q in captured.captured_queries
            if re.search(r'FROM "monitoring_(node|gpu)"(?!\w)', q["sql"]) and "colony_table_changes" not in q["sql"]]


def test_a_steady_cycle_reads_no_node_or_gpu_row_and_a_gpu_written_behind_its_back_is_seen_next_cycle(cluster):
    """The nodes' and GPUs' rows are kept while their tables' change marks stand: a GPU that
    registers (an ORM save) is placed on by the next cycle, and one marked gone by a bulk update
    (no save, no signal) is no longer offered."""
    from monitoring.models import Gpu, Node

    big = TenantFactory(slug="big", guaranteed_gpus=3, max_gpus=3)
    wide = JobFactory(tenant=big, gpus=3)  # waits: the node has 2 GPUs
    cycle()
    settle()
    with CaptureQueriesContext(connection) as captured:
        steady, _ = cycle()
    assert steady.pending == 1 and inventory_reads(captured) == []
    too_wide = JobWait.objects.get(job=wide).reason["code"]

    node = Node.objects.get(name="n1")
    GpuFactory(node=node, index=2)
    with CaptureQueriesContext(connection) as captured:
        grown, _ = cycle()
    assert inventory_reads(captured) and grown.placed == 1
    assert Job.objects.get(pk=wide.pk).state == JobState.PLACED

    from django.utils import timezone

    from jobs.models import Allocation

    Allocation.objects.filter(job=wide).update(released_at=timezone.now())
    Job.objects.filter(pk=wide.pk).update(state=JobState.SUCCEEDED)
    settle()
    Gpu.objects.filter(node=node, index=2).update(present=False)
    again = JobFactory(tenant=big, gpus=3)
    result, _ = cycle()
    assert result.placed == 0 and JobWait.objects.get(job=again).reason["code"] == too_wide
