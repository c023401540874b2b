"""Why a waiting job waits lives in its own narrow row (``JobWait``): carried over from the old
column by the migration, shown only while the job waits, gone when it is placed or ends."""

import time

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.choices import JobState
from jobs.models import Job, JobWait
from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.services import lifecycle
from jobs.services.apply import apply_decisions
from tests.factories import GpuFactory, JobFactory, NodeFactory

WAITING = PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, "Waiting for 1 free GPU.", {"gpus": 1})


def test_a_placed_job_has_no_verdict_left_and_its_eta_error_is_measured(db, live_redis):
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    job = JobFactory()
    apply_decisions(Decisions(pending=(Pending(job.pk, WAITING, time.time()),)))
    assert Job.objects.get(pk=job.pk).pending_reason["code"] == "waiting_for_free_gpus"
    apply_decisions(Decisions(placements=(Place(job.pk, slices=(NodeSlice("n1", (gpu.pk,), (0,)),)),)))
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.PLACED and job.pending_reason is None
    assert not JobWait.objects.filter(job=job).exists()
    assert job.eta_error_s == pytest.approx(0, abs=60)  # promised "now" (rounded to 30 s), placed now


def test_a_cancelled_job_loses_its_verdict_and_a_stale_one_is_never_shown(db):
    job, other = JobFactory(), JobFactory()
    apply_decisions(Decisions(pending=(Pending(job.pk, WAITING), Pending(other.pk, WAITING))))
    assert lifecycle.begin_cancel(job.pk) == JobState.CANCELLED
    assert not JobWait.objects.filter(job=job).exists()
    # A verdict left behind by a race (written just after its job was cancelled) is not shown.
    Job.objects.filter(pk=other.pk).update(state=JobState.SUCCEEDED)
    assert JobWait.objects.filter(job=other).exists() and Job.objects.get(pk=other.pk).pending_reason is None


def test_a_cycle_writes_no_verdict_for_a_job_that_left_the_queue(db):
    gone = JobFactory(state=JobState.CANCELLED)
    apply_decisions(Decisions(pending=(Pending(gone.pk, WAITING, 60.0),)))
    assert not JobWait.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="migrations are exercised on PostgreSQL, as deployed")
def test_the_migration_carries_waiting_jobs_verdicts_over(transactional_db):
    executor = MigrationExecutor(connection)
    before, after = [("jobs", "0016_pending_by_owner")], [("jobs", "0017_job_wait")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    tenant = old.get_model("jobs", "Tenant").objects.create(slug="vision", name="Vision")
    owner = old.get_model("auth", "User").objects.create(username="alice")
    OldJob = old.get_model("jobs", "Job")
    eta_at = int(time.time()) + 600
    waiting = OldJob.objects.create(tenant=tenant, owner=owner, name="w", command=["true"], gpus=1, state="PENDING",
                                    pending_reason={"code": "at_max_gpus", "message": "At the ceiling.",
                                                    "details": {"gpus": 8}, "eta_at": eta_at})
    ended = OldJob.objects.create(tenant=tenant, owner=owner, name="e", command=["true"], gpus=1, state="SUCCEEDED",
                                  pending_reason={"code": "at_max_gpus", "message": "stale", "details": {}})
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    Wait = new.get_model("jobs", "JobWait")
    carried = Wait.objects.get(job_id=waiting.pk)
    assert (carried.reason, carried.eta_at) == ({"code": "at_max_gpus", "message": "At the ceiling.",
                                                 "details": {"gpus": 8}}, eta_at)
    assert not Wait.objects.filter(job_id=ended.pk).exists()
    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL storage parameter")
def test_verdict_pages_keep_room_for_rewrites_in_place(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'jobs_jobwait'")
        assert "fillfactor=50" in (cursor.fetchone()[0] or [])


def test_a_verdict_rewritten_in_place_keeps_the_first_promise(db):
    job = JobFactory()
    apply_decisions(Decisions(pending=(Pending(job.pk, WAITING, time.time() + 600),)))
    promised = JobWait.objects.get(job=job).first_eta_at
    moved = PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, "Waiting for 2 free GPUs.", {"gpus": 2})
    apply_decisions(Decisions(pending=(Pending(job.pk, moved, time.time() + 3600),)))
    wait = JobWait.objects.get(job=job)
    assert wait.reason["message"] == "Waiting for 2 free GPUs." and wait.first_eta_at == promised
    assert wait.eta_at == pytest.approx(time.time() + 3600, abs=60)
