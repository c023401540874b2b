"""A cycle finds the jobs, and the stored verdicts, written since its last read by their stamp
(``jobs.services.job_feed``) instead of listing every pending job or verdict: whatever is written
meanwhile, by whom and when it commits, what it reads is what a fresh read finds, and it lists only
when it must. (tests/jobs/test_verdict_store_history.py drives the verdicts' feed through random
histories.)"""

import json
import os
import random

import psycopg
import pytest

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.choices import JobState
from jobs.models import Job, JobWait
from jobs.scheduling.decisions import Decisions, Pending
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.services import apply, job_feed, waits
from jobs.services.apply import apply_decisions
from jobs.services.job_feed import VerdictFeed
from jobs.services.row_versions import RowVersions
from jobs.services.snapshot_loader import build_snapshot
from tests.factories import JobFactory, TenantFactory
from tests.jobs.test_loop_snapshot import fresh

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the feed is PostgreSQL's")


def other_connection():
    """A second client of the test database, as another process writing jobs would be."""
    params = connection.get_connection_params()
    return psycopg.connect(**{key: params[key] for key in ("dbname", "host", "port", "user", "password")
                              if params.get(key) is not None})


def pending_read(redis_client) -> tuple[dict[int, int], str | None]:
    """Priority of each pending job the snapshot holds, and how the queue was read: "listed" (every
    pending job's version), "feed" (only the jobs written since), None (nothing written since)."""
    with CaptureQueriesContext(connection) as captured:
        pending = build_snapshot(redis_client).pending
    sql = [q["sql"] for q in captured.captured_queries]
    listed = any("xmin::text" in q and 'FROM "jobs_job" WHERE state' in q for q in sql)
    how = "listed" if listed else "feed" if any("changed_xid >=" in q for q in sql) else None
    return {job.id: job.priority for job in pending}, how


def fresh_priorities(redis_client) -> dict[int, int]:
    return {job.id: job.priority for job in fresh(redis_client).pending}


def test_after_a_few_jobs_are_written_only_they_are_found_and_no_queue_is_listed(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(20)]
    build_snapshot(redis_client)
    Job.objects.filter(pk=jobs[3].pk).update(priority=4)
    Job.objects.filter(pk=jobs[5].pk).update(state=JobState.PLACED)
    added = JobFactory(tenant=tenant, priority=2)
    read, how = pending_read(redis_client)
    assert how == "feed"
    assert read == fresh_priorities(redis_client)
    assert read[jobs[3].pk] == 4 and jobs[5].pk not in read and read[added.pk] == 2
    read, how = pending_read(redis_client)
    assert how is None and len(read) == 20  # (nothing written since: neither)


def test_a_write_committed_after_a_read_that_began_before_it_is_still_found(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)
    with other_connection() as other:
        # Another process writes a job and has not committed when the queue is next read.
        other.execute("UPDATE jobs_job SET priority = 7 WHERE id = %s", [jobs[1].pk])
        Job.objects.filter(pk=jobs[2].pk).update(priority=1)  # (a change of this process's: the feed is asked)
        read, how = pending_read(redis_client)
        assert how == "feed" and read[jobs[1].pk] == 0 and read[jobs[2].pk] == 1
        other.commit()
    read, how = pending_read(redis_client)
    assert how == "feed" and read[jobs[1].pk] == 7
    assert read == fresh_priorities(redis_client)


def test_a_deleted_job_makes_the_next_read_list_the_queue(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)
    Job.objects.filter(pk=jobs[0].pk).delete()
    read, how = pending_read(redis_client)
    assert how == "listed" and jobs[0].pk not in read and len(read) == 4
    Job.objects.filter(pk=jobs[1].pk).update(priority=3)
    read, how = pending_read(redis_client)
    assert how == "feed" and read == fresh_priorities(redis_client)


def test_with_the_stamp_switched_off_the_queue_is_listed_and_still_right(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobs_job DISABLE TRIGGER colony_stamp_xid")
    try:
        Job.objects.filter(pk=jobs[4].pk).update(priority=9)  # (no stamp: the feed would miss it)
        read, how = pending_read(redis_client)
        assert how == "listed" and read[jobs[4].pk] == 9
        with connection.cursor() as cursor:  # (on again, but for ordinary sessions only: a replica's go unstamped)
            cursor.execute("ALTER TABLE jobs_job ENABLE TRIGGER colony_stamp_xid")
        Job.objects.filter(pk=jobs[3].pk).update(priority=2)
        read, how = pending_read(redis_client)
        assert how == "listed" and read[jobs[3].pk] == 2
        Job.objects.filter(pk=jobs[3].pk).update(priority=3)
        read, how = pending_read(redis_client)
        assert how == "listed" and read[jobs[3].pk] == 3
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs_job ENABLE ALWAYS TRIGGER colony_stamp_xid")


def test_a_write_let_through_while_the_stamp_was_briefly_off_is_still_found(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobs_job DISABLE TRIGGER colony_stamp_xid")
        cursor.execute("UPDATE jobs_job SET priority = 9 WHERE id = %s", [jobs[0].pk])  # (unstamped)
        cursor.execute("ALTER TABLE jobs_job ENABLE ALWAYS TRIGGER colony_stamp_xid")
    Job.objects.filter(pk=jobs[1].pk).update(priority=2)  # (stamped: the next read asks the feed)
    read, how = pending_read(redis_client)
    assert how == "listed" and read[jobs[0].pk] == 9 and read[jobs[1].pk] == 2
    Job.objects.filter(pk=jobs[2].pk).update(priority=4)
    read, how = pending_read(redis_client)
    assert how == "feed" and read == fresh_priorities(redis_client)


def test_writes_and_deletes_by_a_replica_session_are_found(transactional_db, redis_client):
    """``session_replication_role = replica`` (a logical replication subscriber, pg_restore) skips
    ordinary triggers; the feed's fire in every session."""
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)
    with other_connection() as other:
        other.execute("SET session_replication_role = replica")
        other.execute("UPDATE jobs_job SET priority = 7 WHERE id = %s", [jobs[1].pk])
        other.commit()
    Job.objects.filter(pk=jobs[2].pk).update(priority=1)
    read, how = pending_read(redis_client)
    assert how == "feed" and read[jobs[1].pk] == 7 and read == fresh_priorities(redis_client)
    with other_connection() as other:
        other.execute("SET session_replication_role = replica")
        other.execute("DELETE FROM jobs_job WHERE id = %s", [jobs[3].pk])
        other.commit()
    Job.objects.filter(pk=jobs[2].pk).update(priority=3)
    read, how = pending_read(redis_client)
    assert how == "listed" and jobs[3].pk not in read


def test_a_delete_that_deletes_nothing_lists_no_queue(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(3)]
    build_snapshot(redis_client)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_job WHERE id = -1")  # (a statement, no row: Django's delete asks first)
    Job.objects.filter(pk=jobs[0].pk).update(priority=5)
    read, how = pending_read(redis_client)
    assert how == "feed" and read[jobs[0].pk] == 5


@pytest.mark.parametrize("seed", range(3))
def test_after_any_history_of_writes_by_many_clients_the_queue_read_is_a_fresh_one(
        transactional_db, redis_client, seed):
    rng = random.Random(seed)
    tenant = TenantFactory(slug="vision")
    for _ in range(12):
        JobFactory(tenant=tenant)
    build_snapshot(redis_client)
    ways = []
    with other_connection() as other:
        locked = None  # (the job another client has written and not committed: not written here meanwhile)
        for _ in range(40):
            for _ in range(rng.randrange(4)):
                ids = [pk for pk in Job.objects.values_list("pk", flat=True) if pk != locked]
                job_id, step = rng.choice(ids), rng.randrange(7)
                if step == 0:
                    JobFactory(tenant=tenant, priority=rng.randrange(5))
                elif step == 1:
                    Job.objects.filter(pk=job_id).update(priority=rng.randrange(5))
                elif step == 2:
                    Job.objects.filter(pk=job_id).update(state=rng.choice([JobState.PLACED, JobState.CANCELLED]))
                elif step == 3:
                    Job.objects.filter(pk=job_id).update(state=JobState.PENDING)  # (back in the queue)
                elif step == 4 and rng.random() < 0.2:
                    Job.objects.filter(pk=job_id).delete()
                elif step == 5 and locked is None:  # another client's write, committed some reads later
                    other.execute("UPDATE jobs_job SET priority = %s WHERE id = %s", [rng.randrange(5), job_id])
                    locked = job_id
                elif step == 6 and locked is not None:
                    other.commit()
                    locked = None
            read, how = pending_read(redis_client)
            ways.append(how)
            assert read == fresh_priorities(redis_client)
        other.commit()
    read, _ = pending_read(redis_client)
    assert read == fresh_priorities(redis_client)
    assert ways.count("feed") > 2 * ways.count("listed")  # (deletes alone list the queue again)


# The stored verdicts: the loop keeps its own writes, and finds others' by their stamp.

def told(job_id: int, message: str = "Waiting for 1 free GPU.") -> Pending:
    return Pending(job_id, PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, message, {"gpus": 1}), None)


def verdicts_read(*pending: Pending) -> str | None:
    """Apply a cycle that tells ``pending``; how it read the stored verdicts: "listed", "feed" or None."""
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(Decisions(pending=pending))
    sql = [q["sql"] for q in captured.captured_queries]
    if any("string_agg(job_id::text || ':' || xmin::text" in q and "changed_xid" not in q for q in sql):
        return "listed"
    return "feed" if any("FROM jobs_jobwait WHERE changed_xid >=" in q for q in sql) else None


def stored_message(job_id: int) -> str | None:
    wait = JobWait.objects.filter(job_id=job_id).first()
    return None if wait is None else wait.reason["message"]


def settled_jobs(count: int = 2) -> list[int]:
    """Ids of ``count`` pending jobs whose verdicts the loop wrote and read back (its feed serves)."""
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant).pk for _ in range(count)]
    verdicts_read(*map(told, jobs))
    verdicts_read(*map(told, jobs))
    return jobs


def as_new_process(monkeypatch):
    """The apply's state as a new scheduler process has it."""
    monkeypatch.setattr(apply, "_verdict_versions", RowVersions())
    monkeypatch.setattr(apply, "_verdict_feed", VerdictFeed())
    monkeypatch.setattr(apply, "_settled", None)
    monkeypatch.setattr(apply, "_queue_listed", apply._NOT_LISTED)


@pytest.fixture
def fresh_apply(monkeypatch):
    """The apply as a new process has it (no verdicts kept from other tests)."""
    as_new_process(monkeypatch)


# What another writer leaves in a verdict's row.
STALE = ("UPDATE jobs_jobwait SET reason = '{\"code\": \"stale\", \"message\": \"old\", \"details\": {}}' "
         "WHERE job_id = %s")


def test_after_its_own_writes_the_loop_lists_no_verdict_and_finds_anothers_late_commit(
        transactional_db, fresh_apply):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant).pk for _ in range(4)]
    verdicts_read(*map(told, jobs))
    # (only its own writes since: nothing listed)
    assert verdicts_read(*map(told, jobs[:3]), told(jobs[3], "Waiting for 2 free GPUs.")) == "feed"
    assert verdicts_read(*map(told, jobs)) == "feed"  # (its write of jobs[3] read back by the feed)
    assert verdicts_read(*map(told, jobs)) == "feed"
    assert verdicts_read(*map(told, jobs)) is None  # (nothing written since: nothing read)
    with other_connection() as other:
        # Another process rewrites a verdict and has not committed when the loop next reads.
        other.execute(STALE, [jobs[1]])
        JobWait.objects.filter(job_id=jobs[2]).delete()  # (a committed delete: the loop reads again)
        assert verdicts_read(*map(told, jobs)) == "feed"
        assert stored_message(jobs[2]) == "Waiting for 1 free GPU."  # (written again)
        other.commit()
    assert verdicts_read(*map(told, jobs)) == "feed"
    assert [stored_message(job_id) for job_id in jobs] == ["Waiting for 1 free GPU."] * 4


def test_a_verdict_a_replica_session_rewrites_or_deletes_is_found(transactional_db, fresh_apply):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant).pk for _ in range(3)]
    verdicts_read(*map(told, jobs))
    with other_connection() as other:
        other.execute("SET session_replication_role = replica")
        other.execute(STALE, [jobs[0]])
        other.execute("DELETE FROM jobs_jobwait WHERE job_id = %s", [jobs[1]])
        other.commit()
    assert verdicts_read(*map(told, jobs)) == "feed"
    assert [stored_message(job_id) for job_id in jobs] == ["Waiting for 1 free GPU."] * 3


# (from a review of the verdicts' feed: each failed on its first version)


def state_kept() -> tuple:
    """What a scheduler process keeps of the verdicts between cycles, and its name as a writer."""
    return apply._verdict_versions, apply._verdict_feed, apply._settled, job_feed.writer()


def lead_as_another(monkeypatch) -> tuple:
    """The lease passes to another scheduler process ("scheduler-a"); what this one kept, for
    :func:`lead_again`."""
    kept = state_kept()
    as_new_process(monkeypatch)
    monkeypatch.setattr(job_feed, "_writer", (os.getpid(), "scheduler-a"))
    return kept


def lead_again(monkeypatch, kept: tuple) -> None:
    """This process leads again, with what it kept when the lease left it."""
    for name, value in zip(("_verdict_versions", "_verdict_feed", "_settled"), kept):
        monkeypatch.setattr(apply, name, value)
    monkeypatch.setattr(job_feed, "_writer", (os.getpid(), kept[3]))


def test_a_verdict_another_scheduler_wrote_while_it_led_is_found_when_this_one_leads_again(
        transactional_db, fresh_apply, monkeypatch):
    jobs = settled_jobs()  # (scheduler B leads: writes its verdicts, reads them back)
    # B's lease passes to scheduler A (another process), which tells jobs[0] something else.
    b = lead_as_another(monkeypatch)
    verdicts_read(told(jobs[0], "Held by quota."), told(jobs[1]))
    assert stored_message(jobs[0]) == "Held by quota."
    # B leads again (its process kept its state); the core tells what it told before.
    lead_again(monkeypatch, b)
    verdicts_read(*map(told, jobs))
    verdicts_read(*map(told, jobs))
    assert stored_message(jobs[0]) == "Waiting for 1 free GPU."


def test_a_leader_back_after_another_pruned_the_feeds_logs_still_finds_what_the_other_wrote(
        transactional_db, fresh_apply, monkeypatch):
    jobs = settled_jobs()
    b = lead_as_another(monkeypatch)
    # A leads for three cycles: its feed serves from the second on, and prunes the logs as it reads.
    for _ in range(3):
        verdicts_read(told(jobs[0], "Held by quota."), told(jobs[1]))
    assert stored_message(jobs[0]) == "Held by quota."
    lead_again(monkeypatch, b)
    assert verdicts_read(*map(told, jobs)) == "listed"
    assert stored_message(jobs[0]) == "Waiting for 1 free GPU."


def log_rows_below(horizon: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM colony_verdict_writers WHERE xid < %s::xid8) "
                       "+ (SELECT count(*) FROM colony_deleted_waits WHERE xid < %s::xid8)", [horizon, horizon])
        return cursor.fetchone()[0]


def test_a_lease_passing_back_and_forth_every_cycle_keeps_pruning_the_feeds_logs(
        transactional_db, fresh_apply, monkeypatch):
    """Before, only a feed that served pruned its logs: two schedulers passing the lease every
    cycle each listed, and a writer's row and a delete stayed every cycle, without bound. (How
    much a prune removes stops at the oldest transaction of the whole PostgreSQL cluster, which
    other sessions hold back: so what is checked is that readers prune, and leave nothing below.)"""
    monkeypatch.setattr(job_feed.VerdictFeed, "prune_every", 3)
    horizons = []
    prune = job_feed._prune_verdict_logs
    monkeypatch.setattr(job_feed, "_prune_verdict_logs", lambda horizon: (horizons.append(horizon), prune(horizon)))
    jobs = settled_jobs(3)  # (scheduler B leads)
    kept = {"b": lead_as_another(monkeypatch)}
    horizons.clear()
    ways = []
    for cycle in range(16):
        JobWait.objects.filter(job_id=jobs[cycle % 3]).delete()  # (a delete the trigger logs)
        # Each leader finds the other's writes since it last led: its feed declines, and it lists.
        ways.append(verdicts_read(*map(told, jobs)))
        leading, next_one = ("a", "b") if cycle % 2 == 0 else ("b", "a")
        kept[leading] = state_kept()
        lead_again(monkeypatch, kept[next_one])
    assert ways[1:] == ["listed"] * 15  # (the first: a new process's read of every verdict)
    assert len(horizons) >= 4  # (each leader prunes every third of its listings; before, never)
    assert log_rows_below(max(horizons, key=int)) == 0
    assert [stored_message(job_id) for job_id in jobs] == ["Waiting for 1 free GPU."] * 3


def xmin(job_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM jobs_jobwait WHERE job_id = %s", [job_id])
        return cursor.fetchone()[0]


def test_a_verdict_deleted_and_written_again_is_not_dropped_while_the_delete_is_above_the_horizon(
        transactional_db, fresh_apply):
    jobs = settled_jobs()
    with other_connection() as old:
        old.execute("SELECT pg_current_xact_id()")  # (a long transaction that wrote: pins the horizon)
        # The job is placed (its verdict dropped), then requeued (one written again), by others.
        JobWait.objects.filter(job_id=jobs[0]).delete()
        JobWait.objects.create(job_id=jobs[0], reason={"code": "requeued", "message": "Requeued.", "details": {}})
        verdicts_read(*map(told, jobs))  # (the loop writes its verdict over it)
        assert stored_message(jobs[0]) == "Waiting for 1 free GPU."
        written = xmin(jobs[0])
        verdicts_read(*map(told, jobs))
        assert xmin(jobs[0]) == written  # (not dropped as deleted, and so not written again)
        assert jobs[0] in apply._verdict_versions._values
        old.rollback()


def test_a_rolled_back_cycle_leaves_no_verdict_of_its_own_in_what_the_loop_keeps(
        transactional_db, fresh_apply, monkeypatch):
    jobs = settled_jobs()
    throttle = apply._throttle
    # A lifecycle write in the apply's transaction before it reads the verdicts (as begin_preempt's).
    monkeypatch.setattr(apply, "_throttle", lambda throttles: waits.set_reason(
        [jobs[0]], {"code": "preempted", "message": "Preempted.", "details": {}}) or 0)
    with pytest.raises(RuntimeError), transaction.atomic():  # (as leadership.fenced: the apply is a savepoint)
        apply_decisions(Decisions(pending=tuple(map(told, jobs))))
        raise RuntimeError("the cycle is rolled back")
    monkeypatch.setattr(apply, "_throttle", throttle)
    kept = json.loads(apply._queue().verdicts[jobs[0]][0])["message"]
    assert kept == stored_message(jobs[0]) == "Waiting for 1 free GPU."


def test_a_verdict_with_an_eta_told_new_words_is_written_though_jobs_left_the_queue(transactional_db, fresh_apply):
    """Places move when a job leaves the queue: the verdicts are then matched with last cycle's by
    job and reason object, an ETA's rounded time alone says nothing of the words."""
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant).pk for _ in range(3)]
    waiting = told(jobs[1])
    timed = Pending(jobs[2], waiting.reason, 600.0)
    for _ in range(3):  # (settled: the same verdict objects, nothing written)
        apply_decisions(Decisions(pending=(told(jobs[0]), waiting, timed)))
    Job.objects.filter(pk=jobs[0]).update(state=JobState.PLACED)
    waits.clear([jobs[0]])
    apply_decisions(Decisions(pending=(waiting, Pending(jobs[2], told(jobs[2], "Waiting for 3 free GPUs.").reason,
                                                         600.0))))
    assert stored_message(jobs[2]) == "Waiting for 3 free GPUs."
