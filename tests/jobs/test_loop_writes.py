"""What the scheduling loop writes each cycle: a pending reason only where it changed (an ETA that
holds within its tolerance is kept), set-based however many jobs wait, throttles in a bounded number
of statements, and never a re-send of a launch the same cycle just sent."""

import re
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import protocol
from jobs.choices import RunClass, JobState
from jobs.models import Allocation, Job, JobWait
from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place, Throttle, ThrottleReason
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.services import apply
from jobs.services.apply import apply_decisions
from jobs.services.row_versions import RowVersions
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


@pytest.fixture
def node4(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(4):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def job_updates(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries
            if q["sql"].lstrip().upper().startswith("UPDATE") and '"jobs_job"' in q["sql"].split("SET", 1)[0]]


def verdict_writes(captured) -> list[str]:
    """Statements that write waiting jobs' verdicts (``JobWait``)."""
    # (an executemany is logged as "N times: INSERT ...")
    return [q["sql"] for q in captured.captured_queries
            if re.search(r"\b(INSERT INTO|UPDATE|DELETE FROM) \"jobs_jobwait\"", q["sql"])]


def verdicts(job_ids) -> dict:
    return {job.pk: job.pending_reason for job in Job.objects.filter(pk__in=job_ids).select_related("wait")}


def waiting(message="Waiting for 1 free GPU.", **details) -> PendingReason:
    return PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, message, details)


def test_a_second_cycle_with_nothing_changed_writes_no_job_row(node4, django_capture_on_commit_callbacks):
    tenant = TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=4)
    JobFactory(gpus=4, tenant=tenant)
    queued = [JobFactory(gpus=2, tenant=tenant) for _ in range(5)] + [JobFactory(gpus=8, max_nodes=1, tenant=tenant)]
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    reasons = verdicts([j.pk for j in queued])
    assert all(reasons.values())
    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    assert job_updates(captured) == [] and verdict_writes(captured) == []
    assert verdicts(reasons) == reasons


def test_an_eta_that_holds_within_its_tolerance_is_kept_and_one_that_moved_is_rewritten(db):
    job = JobFactory()
    now = time.time()

    def cycle_with(eta_s, message="Waiting for 1 free GPU."):
        eta_at = None if eta_s is None else now + eta_s
        apply_decisions(Decisions(pending=(Pending(job.pk, waiting(message, gpus=1), eta_at),)))
        job.refresh_from_db()
        return job.pending_reason

    first = cycle_with(600.0)
    assert first["eta_at"] == pytest.approx(now + 600, abs=apply.ETA_ROUNDING_S)
    promised = JobWait.objects.get(job=job).first_eta_at
    assert promised == first["eta_at"]
    assert cycle_with(625.0) == first  # 25 s later than promised: within 30 s
    assert cycle_with(600.0 + 0.09 * 600) == first  # within 10% of the wait
    moved = cycle_with(900.0)
    assert moved["eta_at"] == pytest.approx(now + 900, abs=apply.ETA_ROUNDING_S)
    assert JobWait.objects.get(job=job).first_eta_at == promised  # what it was first promised is kept
    assert cycle_with(900.0, "Waiting for 2 free GPUs.")["message"] == "Waiting for 2 free GPUs."
    assert "eta_at" not in cycle_with(None)


def test_a_reason_whose_details_change_is_rewritten_even_if_its_message_is_not(db):
    job = JobFactory()
    for share in (1.5, 2.5):
        apply_decisions(Decisions(pending=(Pending(job.pk, waiting(share=share, nodes=("a", "b"))),)))
        job.refresh_from_db()
        assert job.pending_reason == {"code": "waiting_for_free_gpus", "message": "Waiting for 1 free GPU.",
                                      "details": {"share": share, "nodes": ["a", "b"]}}


@pytest.mark.parametrize("count", [3, 60])
def test_reasons_are_written_in_the_same_few_statements_however_many_jobs_wait(db, count):
    jobs = [JobFactory() for _ in range(count)]
    jobs_elsewhere = JobFactory(state=JobState.CANCELLED)
    decisions = Decisions(pending=tuple(Pending(j.pk, waiting(f"Waiting, job {j.pk}."), 60.0 * i)
                                        for i, j in enumerate([*jobs, jobs_elsewhere])))
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(decisions)
    if connection.vendor == "postgresql":
        assert len(job_updates(captured)) <= 1 and len(verdict_writes(captured)) == 1  # reservations, verdicts
    assert {j.pk: j.pending_reason["message"] for j in Job.objects.filter(state=JobState.PENDING)} == {
        j.pk: f"Waiting, job {j.pk}." for j in jobs}
    assert Job.objects.get(pk=jobs_elsewhere.pk).pending_reason is None  # not pending: not written


@pytest.mark.parametrize("count", [1, 12])
def test_placements_take_the_same_few_statements_however_many_and_each_node_gets_its_launches(
        db, redis_client, live_redis, count, django_capture_on_commit_callbacks, monkeypatch):
    # (what the apply kept from earlier tests' cycles would change how it reads: a new process's)
    monkeypatch.setattr(apply, "_verdict_versions", RowVersions())
    monkeypatch.setattr(apply, "_settled", None)
    monkeypatch.setattr(apply, "_queue_listed", apply._NOT_LISTED)
    nodes = [NodeFactory(name=f"p{n}") for n in range(3)]
    gpus = [GpuFactory(node=node, index=i) for node in nodes for i in range(4)]
    jobs = [JobFactory() for _ in range(count)]
    cancelled = JobFactory(state=JobState.CANCELLED)  # cancelled since the snapshot: skipped
    decisions = Decisions(placements=tuple(
        Place(job.pk, slices=(NodeSlice(gpu.node.name, (gpu.pk,), (gpu.index,)),))
        for job, gpu in zip([*jobs, cancelled], gpus)))
    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
        applied = apply_decisions(decisions)
    assert applied.placed == count
    assert len(captured) <= 18  # as many for 12 jobs as for 1
    assert set(Job.objects.filter(state=JobState.PLACED).values_list("pk", flat=True)) == {j.pk for j in jobs}
    assert Allocation.objects.filter(job__in=jobs, attempt=1).count() == count
    assert Job.objects.get(pk=cancelled.pk).state == JobState.CANCELLED and not cancelled.allocations.exists()
    launched = {}
    for node in nodes:
        for _, fields in redis_client.xrange(protocol.command_stream(node.name)):
            command = protocol.decode_command(fields)
            launched[command.job_id] = (node.name, command.kind, command.attempt)
    assert launched == {job.pk: (gpu.node.name, "launch", 1) for job, gpu in zip(jobs, gpus)}


def test_throttles_take_a_bounded_number_of_queries_and_tell_each_node_once(node4, redis_client,
                                                                            django_capture_on_commit_callbacks):
    borrowers = []
    for i in range(4):
        job = JobFactory(state=JobState.RUNNING, run_class=RunClass.OPPORTUNISTIC)
        Allocation.objects.create(job=job, gpu=node4.gpus.get(index=i), duty_cycle=1.0 if i else 0.0)
        borrowers.append(job)
    already = borrowers[3]
    Allocation.objects.filter(job=already).update(duty_cycle=0.5)
    ended = JobFactory(state=JobState.SUCCEEDED, run_class=RunClass.OPPORTUNISTIC)
    throttles = tuple(Throttle(j.pk, 0.5, ThrottleReason.GPU_SATURATED) for j in [*borrowers, ended])
    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
        applied = apply_decisions(Decisions(throttles=throttles))
    assert applied.throttled == 3  # the one already at 0.5 and the ended one are left alone
    # One read of their allocations, one update for the one duty cycle. (Not every statement: how
    # the apply reads the queue beside them depends on what earlier cycles left kept.)
    assert len([q for q in captured.captured_queries if '"jobs_allocation"' in q["sql"]]) == 2
    assert sorted(Allocation.objects.values_list("duty_cycle", flat=True)) == [0.5] * 4
    sent = [(c.job_id, c.kind) for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if (c := protocol.decode_command(f))]
    assert sent == [(borrowers[0].pk, "set_duty_cycle"), (borrowers[0].pk, "resume"),
                    (borrowers[1].pk, "set_duty_cycle"), (borrowers[2].pk, "set_duty_cycle")]


def test_duty_cycles_of_many_values_are_stored_in_one_statement(node4, redis_client,
                                                                 django_capture_on_commit_callbacks):
    """AIMD leaves about as many distinct duty cycles as jobs it moves: one UPDATE for all of them
    (one per value was most of a busy cycle's apply), and one pipeline to tell the nodes."""
    jobs = []
    for i in range(4):
        job = JobFactory(state=JobState.RUNNING, run_class=RunClass.OPPORTUNISTIC)
        Allocation.objects.create(job=job, gpu=node4.gpus.get(index=i), duty_cycle=1.0)
        jobs.append(job)
    wanted = {job.pk: duty for job, duty in zip(jobs, (0.5, 0.45, 0.9, 0))}  # (an int among them: suspended)
    throttles = tuple(Throttle(job_id, duty, ThrottleReason.GPU_SATURATED) for job_id, duty in wanted.items())
    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
        assert apply_decisions(Decisions(throttles=throttles)).throttled == 4
    updates = [q["sql"] for q in captured if q["sql"].startswith("UPDATE") and Allocation._meta.db_table in q["sql"]]
    assert len(updates) == (1 if connection.vendor == "postgresql" else 4)
    assert dict(Allocation.objects.values_list("job_id", "duty_cycle")) == wanted
    sent = {c.job_id: getattr(c, "duty_cycle", 0) for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if (c := protocol.decode_command(f))}  # (duty cycle 0 is a SuspendJob)
    assert sent == wanted


def test_a_cycle_does_not_re_send_the_launches_it_has_just_sent(node4, redis_client, settings,
                                                                django_capture_on_commit_callbacks):
    # However slow the cycle (here: a re-send window of 0 s), its own placements are not re-sent.
    settings.COLONY_RESEND_AFTER_S = 0
    job = JobFactory(gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_scheduling_cycle().placed == 1
    launches = [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
                if isinstance(c := protocol.decode_command(f), protocol.LaunchJob)]
    assert [c.job_id for c in launches] == [job.pk]


def test_a_reservation_is_stored_once_and_cleared_when_the_core_drops_it(db):
    from jobs.scheduling.decisions import Reservation

    gang, other = JobFactory(gpus=8), JobFactory()
    since = time.time() - 60
    held = Decisions(reservations=(Reservation(gang.pk, ("n1",), since, since + 600),))
    apply_decisions(held)
    gang.refresh_from_db()
    assert gang.reserved_since.timestamp() == pytest.approx(since)
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(held)  # still held: nothing to write
    assert job_updates(captured) == []
    apply_decisions(Decisions())
    assert list(Job.objects.filter(reserved_since__isnull=False)) == []
    other.refresh_from_db()
    assert other.reserved_since is None


def test_a_reason_someone_else_wrote_since_the_last_cycle_is_seen_and_corrected(db):
    job = JobFactory()
    decisions = Decisions(pending=(Pending(job.pk, waiting(gpus=1), 300.0),))
    for _ in range(2):
        apply_decisions(decisions)
    job.refresh_from_db()
    ours = job.pending_reason
    JobWait.objects.filter(job=job).update(reason={"code": "preempted", "message": "Preempted.", "details": {}})
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(decisions)
    assert verdict_writes(captured)
    job.refresh_from_db()
    assert job.pending_reason == ours


POSTGRESQL = pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's")


def verdict_fetches(captured) -> list[str]:
    """Reads of stored verdicts (rows whose version moved since the last cycle)."""
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT job_id, xmin::text, reason")]


def as_a_new_process(monkeypatch) -> None:
    """The apply's state as a scheduler process that has just started has it: nothing read yet."""
    monkeypatch.setattr(apply, "_verdict_versions", RowVersions())
    monkeypatch.setattr(apply, "_settled", None)
    monkeypatch.setattr(apply, "_queue_listed", apply._NOT_LISTED)
    monkeypatch.setattr(apply, "_text_of_digest", {})


@POSTGRESQL
def test_a_new_process_reads_each_distinct_stored_reason_once_and_rewrites_only_what_differs(
        transactional_db, monkeypatch):
    jobs = [JobFactory() for _ in range(6)]
    decisions = Decisions(pending=tuple(
        Pending(job.pk, waiting(gpus=1 + index % 2)) for index, job in enumerate(jobs)))
    apply_decisions(decisions)
    ours = verdicts([job.pk for job in jobs])
    JobWait.objects.filter(job_id=jobs[3].pk).update(reason={"code": "stale", "message": "old", "details": {}})
    before = row_versions()
    as_a_new_process(monkeypatch)
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(decisions)
    # (three distinct reasons stored: ours two, the stale one; each read as text once)
    texts = [q["sql"] for q in captured.captured_queries if "reason::text" in q["sql"]]
    assert len(texts) == 1 and len(apply._text_of_digest) == 3
    assert verdicts([job.pk for job in jobs]) == ours
    after = row_versions()
    assert {job_id for job_id in before if before[job_id] != after[job_id]} == {jobs[3].pk}
    # Someone else writes a reason known already: its row is read again, its text is not.
    JobWait.objects.filter(job_id=jobs[4].pk).update(reason=JobWait.objects.get(job_id=jobs[0].pk).reason)
    with CaptureQueriesContext(connection) as captured:
        apply_decisions(decisions)
    assert len(verdict_fetches(captured)) == 1
    assert not [q for q in captured.captured_queries if "reason::text" in q["sql"]]
    assert verdicts([job.pk for job in jobs]) == ours


def row_versions() -> dict[int, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, xmin::text FROM jobs_jobwait")
        return dict(cursor.fetchall())


@POSTGRESQL
def test_a_new_process_tells_a_stored_reason_from_one_equal_in_value_but_worded_otherwise(
        transactional_db, monkeypatch):
    first, second = JobFactory(), JobFactory()
    told = waiting(seconds=600.0)
    apply_decisions(Decisions(pending=(Pending(first.pk, told), Pending(second.pk, told))))
    JobWait.objects.filter(job_id=second.pk).update(reason={**told.as_dict(), "details": {"seconds": 600}})
    as_a_new_process(monkeypatch)
    apply_decisions(Decisions(pending=(Pending(first.pk, told), Pending(second.pk, told))))
    assert [reason["details"] for reason in JobWait.objects.order_by("job_id").values_list("reason", flat=True)] == [
        {"seconds": 600.0}, {"seconds": 600.0}]
    assert [type(reason["details"]["seconds"]) for reason in
            JobWait.objects.order_by("job_id").values_list("reason", flat=True)] == [float, float]


@POSTGRESQL
def test_a_stored_reason_rewritten_while_a_new_process_reads_the_store_is_written_again(
        transactional_db, monkeypatch):
    # Between the read of the digests and the read of their texts, the only verdict of one digest
    # is rewritten: its text is not found, and the verdict reads as none stored.
    jobs = [JobFactory() for _ in range(3)]
    decisions = Decisions(pending=tuple(
        Pending(job.pk, waiting("Waiting for a GPU.", rank=index)) for index, job in enumerate(jobs)))
    apply_decisions(decisions)
    ours = verdicts([job.pk for job in jobs])
    as_a_new_process(monkeypatch)
    read_texts = apply._reason_texts

    def rewritten_meanwhile(cursor, table, digests):
        gone = min(digests)
        cursor.execute(f"UPDATE {table} SET reason = '{{\"code\": \"stale\"}}' WHERE reason_digest = %s", [gone])
        return read_texts(cursor, table, digests)

    monkeypatch.setattr(apply, "_reason_texts", rewritten_meanwhile)
    apply_decisions(decisions)
    assert verdicts([job.pk for job in jobs]) == ours


@POSTGRESQL
def test_verdicts_a_committed_cycle_wrote_are_not_read_back_but_anyone_elses_change_is(
        transactional_db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(2):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    tenant = TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=2)
    JobFactory(gpus=2, tenant=tenant)
    queued = [JobFactory(gpus=2, tenant=tenant) for _ in range(4)]
    run_scheduling_cycle()  # places the first, writes the others' verdicts (and commits)
    written = verdicts([j.pk for j in queued])
    assert all(written.values())

    with CaptureQueriesContext(connection) as captured:
        run_scheduling_cycle()
    assert verdict_fetches(captured) == [] and verdict_writes(captured) == []

    # Someone else rewrites one verdict (a stale or wrong one): the loop sees the row moved, reads
    # it back and puts its own verdict there again.
    JobWait.objects.filter(job_id=queued[1].pk).update(reason={"code": "stale", "message": "old", "details": {}})
    with CaptureQueriesContext(connection) as captured:
        run_scheduling_cycle()
    assert len(verdict_fetches(captured)) == 1 and len(verdict_writes(captured)) == 1
    assert verdicts([j.pk for j in queued]) == written
    # ... and the cycle after takes what it wrote as read: no row looked at one by one again.
    with CaptureQueriesContext(connection) as captured:
        run_scheduling_cycle()
    assert verdict_fetches(captured) == [] and verdict_writes(captured) == []
    assert not [q for q in captured.captured_queries if "txid_current_if_assigned" in q["sql"]]

    # A cycle that is rolled back remembers nothing it wrote.
    JobWait.objects.filter(job_id=queued[2].pk).update(reason={"code": "stale", "message": "old", "details": {}})
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        apply_decisions(Decisions(pending=tuple(
            Pending(j.pk, waiting("Rolled back.")) for j in queued)))
        raise RuntimeError("the cycle's transaction fails after writing")
    run_scheduling_cycle()
    assert verdicts([j.pk for j in queued]) == written


@POSTGRESQL
def test_an_eta_kept_within_its_tolerance_is_rewritten_once_it_comes_near_though_nothing_else_changed(
        transactional_db, monkeypatch):
    # Cycles whose verdicts and store are those of a cycle that wrote nothing are settled from
    # what that cycle found: the one ETA it kept within tolerance is still looked at each time.
    from datetime import datetime, timezone as dt_timezone

    from django.utils import timezone

    job, start = JobFactory(), 30 * 60_000_000.0
    clock = [start]
    monkeypatch.setattr(timezone, "now", lambda: datetime.fromtimestamp(clock[0], tz=dt_timezone.utc))

    def cycle_at(moment: float, eta_at: float) -> int | None:
        clock[0] = moment
        apply_decisions(Decisions(pending=(Pending(job.pk, waiting(gpus=1), eta_at),)))
        return JobWait.objects.get(job=job).eta_at

    promised = cycle_at(start, start + 3000)
    assert promised == start + 3000
    # 90 s later than promised, 3,000 s ahead: within 10% of the wait, kept (twice: the second
    # time from what the first found)
    assert cycle_at(start + 10, start + 3090) == promised
    assert cycle_at(start + 20, start + 3090) == promised
    # The same estimate 590 s ahead: 90 s is past 10% of the wait now
    assert cycle_at(start + 2500, start + 3090) == start + 3090


@POSTGRESQL
@pytest.mark.parametrize("one_reason", [True, False], ids=["the same reason object", "equal reasons"])
def test_when_a_few_etas_move_in_a_settled_queue_only_those_are_rewritten_and_tolerance_still_holds(
        transactional_db, monkeypatch, one_reason):
    # A settled queue (the cycle before wrote nothing) where a few ETAs move, as when a running job
    # overruns its expected end: those jobs alone are compared with what is stored; one that moved
    # past its tolerance is rewritten, one within it is kept and looked at again the next cycles.
    # (The core hands out the same reason object cycle after cycle, ``InternedReasons``; an equal
    # one built anew must be judged the same way.)
    from datetime import datetime, timezone as dt_timezone

    from django.utils import timezone

    jobs, start = [JobFactory() for _ in range(4)], 30 * 60_000_000.0
    clock, shared = [start], waiting(gpus=1)
    monkeypatch.setattr(timezone, "now", lambda: datetime.fromtimestamp(clock[0], tz=dt_timezone.utc))

    def cycle_at(moment: float, etas_at: list[float]) -> list[int | None]:
        clock[0] = moment
        apply_decisions(Decisions(pending=tuple(
            Pending(job.pk, shared if one_reason else waiting(gpus=1), eta_at)
            for job, eta_at in zip(jobs, etas_at))))
        stored = dict(JobWait.objects.values_list("job_id", "eta_at"))
        return [stored[job.pk] for job in jobs]

    etas = [start + 3000 + 600 * i for i in range(4)]
    assert cycle_at(start, etas) == etas
    assert cycle_at(start + 2, etas) == etas  # settled: nothing written
    # Job 1's ETA moves by 20 min (rewritten); job 2's by 60 s, within 10% of its 4,200 s wait (kept).
    moved = [etas[0], etas[1] + 1200, etas[2] + 60, etas[3]]
    assert cycle_at(start + 4, moved) == [etas[0], etas[1] + 1200, etas[2], etas[3]]
    assert cycle_at(start + 6, moved) == [etas[0], etas[1] + 1200, etas[2], etas[3]]
    # Settled again; job 3's ETA moves by 60 s too, within 10% of its 4,800 s wait: kept.
    moved[3] += 60
    assert cycle_at(start + 8, moved) == [etas[0], etas[1] + 1200, etas[2], etas[3]]
    # Jobs 2 and 3 come near: 60 s is past 10% of a 560 s wait, and past the 30 s floor.
    assert cycle_at(etas[2] - 500, moved) == [etas[0], etas[1] + 1200, etas[2] + 60, etas[3]]
    assert cycle_at(etas[3] - 500, moved) == moved


@POSTGRESQL
def test_a_settled_queue_stays_settled_across_its_own_writes_and_still_sees_everyone_elses(transactional_db):
    # After a cycle writes the few verdicts that changed, the next cycles compare only what moves;
    # a reason that changes back is written back, and a verdict someone else rewrote is corrected.
    jobs = [JobFactory() for _ in range(3)]

    def cycle(messages: list[str]) -> list[str]:
        apply_decisions(Decisions(pending=tuple(
            Pending(job.pk, waiting(message, gpus=1)) for job, message in zip(jobs, messages))))
        stored = {job_id: reason["message"] for job_id, reason in JobWait.objects.values_list("job_id", "reason")}
        return [stored[job.pk] for job in jobs]

    usual = ["Waiting for 1 free GPU."] * 3
    assert cycle(usual) == usual
    assert cycle(usual) == usual
    other = ["Waiting for 2 free GPUs.", *usual[1:]]
    assert cycle(other) == other
    assert cycle(other) == other
    assert cycle(usual) == usual  # changed back: written back
    JobWait.objects.filter(job_id=jobs[1].pk).update(reason={"code": "stale", "message": "old", "details": {}})
    assert cycle(usual) == usual
    assert cycle(other) == other


@POSTGRESQL
def test_a_settled_queue_whose_verdicts_trade_places_or_change_their_words_is_stored_right(transactional_db):
    # Against a settled store, a cycle compares its verdicts with the last cycle's place by place
    # and looks only at those that differ: two jobs that trade verdicts, a reason that changes its
    # words, a job told an ETA and then none again must each end up stored as the core said.
    jobs = [JobFactory() for _ in range(6)]
    one, two = waiting(gpus=1), waiting("Waiting for 2 free GPUs.", gpus=2)

    def cycle(told: list[tuple[PendingReason, float | None]]) -> list[tuple[str, bool]]:
        apply_decisions(Decisions(pending=tuple(
            Pending(job.pk, reason, eta_at) for job, (reason, eta_at) in zip(jobs, told))))
        stored = {job_id: (reason["message"], eta_at is not None)
                  for job_id, reason, eta_at in JobWait.objects.values_list("job_id", "reason", "eta_at")}
        return [stored[job.pk] for job in jobs]

    def expected(told):
        return [(reason.message, eta_at is not None) for reason, eta_at in told]

    told = [(one, None)] * 3 + [(two, None)] * 3
    assert cycle(told) == expected(told)
    assert cycle(told) == expected(told)  # settled
    traded = [(one, None), (two, None), (one, None), (two, None), (one, None), (two, None)]
    assert cycle(traded) == expected(traded)
    reworded = [*traded[:2], (waiting("Waiting for 3 free GPUs.", gpus=3), None), *traded[3:]]
    assert cycle(reworded) == expected(reworded)
    with_eta = [*reworded[:4], (two, 600.0), reworded[5]]
    assert cycle(with_eta) == expected(with_eta)
    assert cycle(reworded) == expected(reworded)  # the ETA gone again


@POSTGRESQL
def test_a_settled_queue_that_gains_and_loses_jobs_is_still_stored_right(transactional_db, monkeypatch):
    # The queue moves between two cycles (a job placed, one submitted) while someone else rewrites
    # a stored verdict: the verdicts no longer line up by place with the settled ones, and each job
    # must still end up stored as the core said, its own reason and ETA.
    from datetime import datetime, timezone as dt_timezone

    from django.utils import timezone

    clock = [30 * 60_000_000.0]
    monkeypatch.setattr(timezone, "now", lambda: datetime.fromtimestamp(clock[0], tz=dt_timezone.utc))
    jobs = [JobFactory() for _ in range(5)]
    one, two = waiting(gpus=1), waiting("Waiting for 2 free GPUs.", gpus=2)

    def cycle(told: dict) -> dict:
        clock[0] += 300  # (an ETA 600 s from now each time: past its tolerance, its time must move)
        apply_decisions(Decisions(pending=tuple(Pending(job.pk, reason, None if eta_s is None else clock[0] + eta_s)
                                                for job, (reason, eta_s) in told.items())))
        stored = {job_id: (reason["message"], eta_at)
                  for job_id, reason, eta_at in JobWait.objects.values_list("job_id", "reason", "eta_at")}
        return {job: stored.get(job.pk) for job in told}

    def expected(told: dict) -> dict:
        return {job: (reason.message, None if eta_s is None else apply._eta_at(clock[0] + eta_s))
                for job, (reason, eta_s) in told.items()}

    told = {job: (one, None) for job in jobs}
    assert cycle(told) == expected(told)
    assert cycle(told) == expected(told)  # settled
    Job.objects.filter(pk=jobs[0].pk).update(state=JobState.PLACED)
    JobWait.objects.filter(job_id=jobs[0].pk).delete()
    JobWait.objects.filter(job_id=jobs[3].pk).update(reason={"code": "stale", "message": "old", "details": {}})
    newcomer = JobFactory()
    told = {**{job: (one, None) for job in jobs[1:]}, jobs[2]: (two, None), newcomer: (one, None)}
    assert cycle(told) == expected(told)
    told[jobs[4]] = (two, 600.0)
    assert cycle(told) == expected(told)
    del told[newcomer]
    Job.objects.filter(pk=newcomer.pk).update(state=JobState.CANCELLED)
    assert cycle(told) == expected(told)  # (the same ETA in seconds, 300 s later)
    # A job placed between snapshot and apply is told nothing (its verdict left as it was); back in
    # the queue, the same verdict told again is stored.
    Job.objects.filter(pk=jobs[1].pk).update(state=JobState.PLACED)
    JobWait.objects.filter(job_id=jobs[1].pk).delete()
    told[jobs[1]], told[jobs[4]] = (two, None), (one, None)
    assert cycle(told)[jobs[1]] is None
    Job.objects.filter(pk=jobs[1].pk).update(state=JobState.PENDING)
    assert cycle(told) == expected(told)
    assert cycle(told) == expected(told)


@POSTGRESQL
@pytest.mark.parametrize("before,after", [(1, 1.0), (1, True)])
def test_a_reason_equal_in_value_but_worded_otherwise_is_rewritten_in_a_settled_queue(
        transactional_db, before, after):
    # 1 == 1.0 == True, but they are stored as 1, 1.0 and true: a settled queue told a reason equal
    # to the last one but written otherwise stores it as written, as a full comparison would.
    jobs = [JobFactory() for _ in range(3)]

    def cycle(value) -> list[str]:
        reason = PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, "Waiting.", {"n": value})
        apply_decisions(Decisions(pending=tuple(Pending(job.pk, reason, None) for job in jobs)))
        return [repr(JobWait.objects.get(job_id=job.pk).reason["details"]["n"]) for job in jobs]

    assert cycle(before) == [repr(before)] * 3
    assert cycle(before) == [repr(before)] * 3  # settled
    assert cycle(after) == [repr(after)] * 3
