"""The snapshot gives each job the GPU service its earlier runs had (issue 34): a borrower preempted
after hours comes back as served, not as fresh, and cannot turn over borrowers served less."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState, RunClass
from jobs.models import Allocation, Job
from jobs.scheduling import PreemptReason, decide
from jobs.services import snapshot_loader
from jobs.services.scheduler_config import scheduler_config
from jobs.services.snapshot_loader import build_snapshot
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory

HOUR = 3600.0
GIB = 1024


@pytest.fixture(autouse=True)
def fresh_snapshot():
    """What other tests' snapshots kept is none of these tests' business, nor theirs of these."""
    snapshot_loader.forget()
    yield
    snapshot_loader.forget()


@pytest.fixture
def gpu(redis_client):
    node = NodeFactory(name="a")
    redis_client.set(protocol.heartbeat_key(node.name), "{}", ex=60)
    return GpuFactory(node=node, index=0, memory_mib=80 * GIB)


def earlier_run(job, gpu, hours: float, *, milli: int = 1000, attempt: int = 1, ended_ago_h: float = 1.0):
    """An allocation of a run that ended ``ended_ago_h`` hours ago after ``hours`` on ``gpu``."""
    released = timezone.now() - timedelta(hours=ended_ago_h)
    allocation = Allocation.objects.create(job=job, gpu=gpu, gpu_milli=milli, attempt=attempt)
    Allocation.objects.filter(pk=allocation.pk).update(created_at=released - timedelta(hours=hours),
                                                       released_at=released)


def preempted(tenant, gpu, *runs_h: float, milli: int = 1000, **fields):
    """A job back in the queue after a run of each of ``runs_h`` hours, as the lifecycle leaves it."""
    job = JobFactory(tenant=tenant, state=JobState.PENDING, gpu_milli=milli, attempt=len(runs_h),
                     preempt_count=len(runs_h), **fields)
    for attempt, hours in enumerate(runs_h, start=1):
        earlier_run(job, gpu, hours, milli=milli, attempt=attempt, ended_ago_h=len(runs_h) - attempt + 1)
    return job


def pending(redis_client) -> dict[int, float]:
    return {job.id: job.attained_gpu_s for job in build_snapshot(redis_client).pending}


def running(redis_client) -> dict[int, float]:
    return {job.id: job.attained_gpu_s for job in build_snapshot(redis_client).running}


def test_a_job_preempted_after_two_hours_on_a_gpu_comes_back_with_two_gpu_hours(db, redis_client, gpu):
    job = preempted(TenantFactory(slug="vision"), gpu, 2.0)
    assert pending(redis_client)[job.pk] == pytest.approx(2 * HOUR, abs=1)


def test_a_run_on_half_a_gpu_counts_half_and_every_run_counts(db, redis_client, gpu):
    tenant = TenantFactory(slug="vision")
    half = preempted(tenant, gpu, 2.0, milli=500)
    twice = preempted(tenant, gpu, 2.0, 1.5)
    served = pending(redis_client)
    assert served[half.pk] == pytest.approx(HOUR, abs=1)
    assert served[twice.pk] == pytest.approx(3.5 * HOUR, abs=1)


def test_a_job_never_run_has_no_service_and_costs_no_query_for_it(db, redis_client, gpu):
    job = JobFactory(tenant=TenantFactory(slug="vision"))
    with CaptureQueriesContext(connection) as captured:
        assert pending(redis_client) == {job.pk: 0.0}
    # (the service is a column of the pending rows' read: no statement of its own)
    assert not [q for q in captured.captured_queries
                if "SUM(" in q["sql"].upper() and '"JOBS_JOB"."STATE"' not in q["sql"].upper()]
    if connection.vendor == "postgresql":  # ... whose allocations are not even looked at for it
        plan = (snapshot_loader._pending_queryset()
                .values_list(*snapshot_loader.PENDING_FIELDS, *snapshot_loader.LAST_FIELDS).explain(analyze=True))
        assert "SubPlan" in plan and "never executed" in plan


def test_a_running_job_counts_its_earlier_runs_not_the_one_under_way(db, redis_client, gpu):
    tenant = TenantFactory(slug="vision")
    job = JobFactory(tenant=tenant, state=JobState.RUNNING, attempt=2, preempt_count=1,
                     started_at=timezone.now() - timedelta(hours=3))
    earlier_run(job, gpu, 1.0, attempt=1, ended_ago_h=4.0)
    current = Allocation.objects.create(job=job, gpu=gpu, attempt=2)
    Allocation.objects.filter(pk=current.pk).update(created_at=timezone.now() - timedelta(hours=3))
    first_run = JobFactory(tenant=tenant, state=JobState.RUNNING, attempt=1)
    Allocation.objects.create(job=first_run, gpu=GpuFactory(node=gpu.node, index=1), attempt=1)
    served = running(redis_client)
    assert served[job.pk] == pytest.approx(HOUR, abs=1) and served[first_run.pk] == 0.0
    assert running(redis_client)[job.pk] == pytest.approx(HOUR, abs=1)  # (the second time from what was kept)


@pytest.mark.django_db(transaction=True)
def test_a_job_preempted_again_is_read_again_with_its_new_run(redis_client, gpu):
    """Committed one by one, as in production: the pending row is kept by its version until the
    requeue writes it, and then read again with the service its new run added."""
    job = preempted(TenantFactory(slug="vision"), gpu, 2.0)
    assert pending(redis_client)[job.pk] == pytest.approx(2 * HOUR, abs=1)
    earlier_run(job, gpu, 1.0, attempt=2, ended_ago_h=0.5)
    Job.objects.filter(pk=job.pk).update(attempt=2, preempt_count=2)
    assert pending(redis_client)[job.pk] == pytest.approx(3 * HOUR, abs=1)


@pytest.mark.django_db(transaction=True)  # (rows the reading transaction wrote are read again each time)
def test_a_steady_cycle_reads_no_more_for_many_jobs_run_before_than_for_a_few(redis_client, gpu):
    tenant = TenantFactory(slug="vision")
    node = gpu.node

    def add(count):
        for _ in range(count):
            preempted(tenant, gpu, 1.0)
            job = JobFactory(tenant=tenant, state=JobState.RUNNING, attempt=2, preempt_count=1)
            earlier_run(job, gpu, 1.0)
            Allocation.objects.create(job=job, gpu=GpuFactory(node=node), attempt=2)

    def steady_queries():
        build_snapshot(redis_client)  # (takes in what was added)
        build_snapshot(redis_client)  # (lists what a first read took without a listing)
        with CaptureQueriesContext(connection) as captured:
            build_snapshot(redis_client)
        return [q["sql"] for q in captured.captured_queries]

    add(2)
    few = steady_queries()
    add(20)
    many = steady_queries()
    assert len(many) == len(few)
    if connection.vendor == "postgresql":  # (elsewhere every cycle reads the whole queue again)
        assert not [sql for sql in many if "SUM(" in sql.upper()]


def test_a_borrower_preempted_after_five_hours_does_not_turn_over_one_that_ran_two(db, redis_client, gpu):
    """Turnover lets a borrower with little service preempt one served past an hour; one that had
    five hours before its preemption is no such borrower, however fresh its row."""
    old, new = (TenantFactory(slug=slug, guaranteed_gpus=0, max_gpus=8) for slug in ("old", "new"))
    victim = JobFactory(tenant=old, state=JobState.RUNNING, run_class=RunClass.OPPORTUNISTIC, checkpoints=True,
                        attempt=1, started_at=timezone.now() - timedelta(hours=2))
    Allocation.objects.create(job=victim, gpu=gpu, attempt=1, memory_limit_mib=70 * GIB)  # (no room beside it)
    waiting = preempted(new, gpu, 5.0, gpu_memory_mib=20 * GIB)
    snapshot = build_snapshot(redis_client)
    now = timezone.now().timestamp()
    config = scheduler_config()
    assert config.borrower_turnover_gpu_s == HOUR and config.turnover_when_blocked

    def turned_over(snapshot):
        return [(p.job_id, p.for_job_id) for p in decide(snapshot, now, config).preemptions
                if p.reason is PreemptReason.LEAST_ATTAINED]

    assert turned_over(snapshot) == []
    # The same cluster with the service forgotten, as the loader left it before: turned over.
    forgotten = replace(snapshot, pending=tuple(replace(r, attained_gpu_s=0.0) for r in snapshot.pending))
    assert turned_over(forgotten) == [(victim.pk, waiting.pk)]
