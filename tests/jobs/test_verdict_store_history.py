"""Whatever happens to the queue and its stored verdicts between cycles (jobs placed, submitted,
cancelled and requeued, verdicts rewritten or deleted by someone else, the queue told in another
order, ETAs coming and going), after each cycle every pending job the core told about holds its
verdict in the store: the core's reason, and its ETA to within the tolerance the apply keeps.
The apply compares only what moved since a settled cycle; this holds it to what a full
comparison would store."""

import random
from typing import NamedTuple
from datetime import datetime, timezone as dt_timezone

import pytest
from django.db import connection
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobWait
from jobs.scheduling.decisions import Decisions, Pending
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.services import apply, snapshot_loader
from jobs.services.apply import apply_decisions
from jobs.services.row_versions import RowVersions
from tests.factories import JobFactory, TenantFactory

POSTGRESQL = pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's")

REASONS = [PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, f"Waiting for {n} free GPUs.", {"gpus": n})
           for n in (1, 2, 4)] + [PendingReason(ReasonCode.AT_MAX_GPUS, "At the ceiling.", {"used": 3})]


def stored_as_told(told: dict[int, tuple[PendingReason, float | None]], now: float) -> dict[int, str]:
    """What differs between the store and what the core told, for each job pending now."""
    pending = set(Job.objects.filter(state=JobState.PENDING).values_list("id", flat=True))
    stored = {job_id: (reason, eta_at) for job_id, reason, eta_at in JobWait.objects.values_list(
        "job_id", "reason", "eta_at")}
    wrong = {}
    for job_id, (reason, eta_at) in told.items():
        if job_id not in pending:
            continue
        found = stored.get(job_id)
        if found is None:
            wrong[job_id] = "no verdict stored"
        elif apply._canonical(found[0]) != apply._canonical(reason.as_dict()):
            wrong[job_id] = f"stored {found[0]['message']!r}, told {reason.message!r}"
        elif not apply._eta_holds(found[1], None if eta_at is None else apply._eta_at(eta_at), now):
            wrong[job_id] = f"stored ETA {found[1]}, told {eta_at} at {now}"
    return wrong


class Request(NamedTuple):
    """What the apply reads of the snapshot's pending requests (``decided_on``)."""

    id: int
    reserved_since: float | None = None


@POSTGRESQL
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("as_the_loop", [False, True], ids=["listed", "decided"])
def test_after_any_history_the_store_holds_what_the_core_told(transactional_db, monkeypatch, seed, as_the_loop):
    """``as_the_loop``: the apply is handed the snapshot's pending jobs and where each verdict was
    told last cycle, as the loop hands them (now and then a hint that is wrong: stale or out of
    range), and a job placed meanwhile is one the snapshot read as pending."""
    rng = random.Random(seed)
    monkeypatch.setattr(apply, "_verdict_versions", RowVersions())
    monkeypatch.setattr(apply, "_settled", None)
    monkeypatch.setattr(apply, "_queue_listed", apply._NOT_LISTED)
    monkeypatch.setattr(snapshot_loader, "_pending_versions", RowVersions(ordered=True))
    clock = [1_900_000_000.0]
    monkeypatch.setattr(timezone, "now", lambda: datetime.fromtimestamp(clock[0], tz=dt_timezone.utc))
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant).pk for _ in range(10)]
    told: dict[int, tuple[PendingReason, float | None]] = {
        job_id: (rng.choice(REASONS), rng.choice([None, None, clock[0] + 600.0 + 60 * rng.randrange(20)]))
        for job_id in jobs}
    order = list(jobs)
    told_as: dict[int, Pending] = {}
    told_at: dict[int, int] = {}  # job -> where it was told last cycle

    def verdict(job_id: int) -> Pending:
        """The verdict told ``job_id``: the very object told last time while its words and ETA are
        the same, as the core hands them back (the apply finds what moved by identity)."""
        reason, eta_at = told[job_id]
        found = told_as.get(job_id)
        if found is None or found.reason is not reason or found.eta_at != eta_at:
            found = told_as[job_id] = Pending(job_id, reason, eta_at)
        return found

    for _ in range(40):
        for _ in range(rng.choice([0, 0, 0, 1, 2, 3])):  # what happens between two cycles
            event, pending = rng.randrange(8), [job for job in order if job in told]
            job_id = rng.choice(pending) if pending else None
            if event == 0 or job_id is None:  # submitted
                job_id = JobFactory(tenant=tenant).pk
                order.insert(rng.randrange(len(order) + 1), job_id)
                told[job_id] = (rng.choice(REASONS), None)
            elif event == 1:  # placed (the lifecycle drops its verdict)
                Job.objects.filter(pk=job_id).update(state=JobState.PLACED)
                JobWait.objects.filter(job_id=job_id).delete()
                del told[job_id]
                order.remove(job_id)
            elif event == 2:  # cancelled, its verdict left behind
                Job.objects.filter(pk=job_id).update(state=JobState.CANCELLED)
                del told[job_id]
                order.remove(job_id)
            elif event == 3:  # someone else rewrites a verdict
                JobWait.objects.filter(job_id=job_id).update(
                    reason={"code": "stale", "message": "old", "details": {}}, eta_at=rng.choice([None, 5]))
            elif event == 4:  # or deletes one
                JobWait.objects.filter(job_id=job_id).delete()
            elif event == 5:  # the core tells a job another reason (the very object, or an equal new one)
                reason = rng.choice(REASONS)
                if rng.random() < 0.5:
                    reason = PendingReason(reason.code, reason.message, dict(reason.details))
                told[job_id] = (reason, told[job_id][1])
            elif event == 6:  # an ETA comes, moves or goes (else it stays at one time as the clock nears it)
                # (ETAs of their own: one job's ETA is never taken for another's by chance)
                eta = rng.choice([None, 120.0, 600.0, 5000.0])
                told[job_id] = (told[job_id][0], None if eta is None else clock[0] + eta + 60 * rng.randrange(20))
            else:  # the queue in another order
                rng.shuffle(order)
        clock[0] += rng.choice([2, 2, 30, 300])
        waiting = [job for job in order if job in told]
        # (now and then a job placed between the snapshot and the apply is told about still)
        placed_meanwhile = []
        if waiting and rng.random() < 0.1:
            placed_meanwhile = [rng.choice(waiting)]
            Job.objects.filter(pk=placed_meanwhile[0]).update(state=JobState.PLACED)
            JobWait.objects.filter(job_id=placed_meanwhile[0]).delete()
        if as_the_loop:
            hints = [told_at.get(job_id, -1) for job_id in waiting]
            if hints and rng.random() < 0.2:  # (a queue last told before the last cycle)
                hints[rng.randrange(len(hints))] = rng.choice([-1, 0, len(hints) - 1, len(hints) + 5])
            apply_decisions(Decisions(pending=tuple(map(verdict, waiting)), told_at=((0, hints),)),
                            tuple(Request(job_id) for job_id in waiting))
            told_at = {job_id: at for at, job_id in enumerate(waiting)}
        else:
            apply_decisions(Decisions(pending=tuple(map(verdict, waiting))))
        assert stored_as_told(told, clock[0]) == {}
        for job_id in placed_meanwhile:  # (back in the queue: told again next cycle)
            Job.objects.filter(pk=job_id).update(state=JobState.PENDING)
