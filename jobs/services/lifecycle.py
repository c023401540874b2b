"""Every state change a job can make, each one function: the only code that writes ``Job.state``.

A job's life is a sequence of *attempts*. Each placement starts a new one (``Job.attempt`` counts
them) and the launch command of attempt N has the id ``launch-<job>-<N>``; everything a node
reports about a run names that id. Each function here is one conditional update fenced by the
state (and, for node reports, the attempt) it expects, plus the commands it sends after commit:

    PENDING --place--> PLACED --start--> RUNNING --finish--> SUCCEEDED | FAILED | TIMEOUT
       |                  \\________________/  |
       |                         | begin_cancel / begin_preempt / begin_requeue / time_out
       v                         v
    CANCELLED     CANCELLING (-> CANCELLED) | PREEMPTING (-> PENDING, next attempt) | TIMEOUT
                  node lost or job vanished: requeue_now -> PENDING at once

Rules every function keeps:

- A report for an attempt that is not the job's current one (an earlier run's exit re-sent after
  a Redis restart, a stale stop's answer) changes nothing; it is counted in
  :data:`IGNORED_REPORTS_KEY` and logged, so operators can see fencing at work. One exception:
  the real exit of an attempt that :func:`requeue_now` gave up (its node lost) wins over the
  requeue while no attempt has started since; after that it is only written on the timeline.
- An exit 0 is success, also during a preemption notice: a job that finished never runs again.
- A job holds its GPUs (live ``Allocation`` rows) until its node confirms the process gone, even
  once its outcome is settled (a job timed out by the control plane); the snapshot counts every
  live allocation, so no GPU is handed out while a process may still run on it.
- Commands go out in ``transaction.on_commit``: a rolled-back change sends nothing.

Callers: :mod:`jobs.services.apply` (place, preempt), :mod:`jobs.services.agent_events` (start,
finish), :mod:`jobs.services.node_health` (node lost, vanished, overdue), and
:mod:`jobs.services.submission` (cancel, operator requeue, which the admin and API use).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Case, CharField, F, Value, When
from django.utils import timezone

from jobs.choices import RunClass, JobEventKind, JobState
from jobs.models import Allocation, Job, JobDependency, JobEvent, JobWait
from jobs.scheduling import reasons
from jobs.scheduling.decisions import Place
from jobs.scheduling.reasons import PendingReason
from jobs.services import launch_failures, waits
from jobs.services.bulk_rows import ids_in, insert_rows
from jobs.services.commands import launch_commands, launch_id, publish_many, send_stop
from jobs.services.launches import LAUNCH_FIELDS, LAUNCH_RELATED, launch_envs, launch_spec, master_hosts
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

IGNORED_REPORTS_KEY = "colony:lifecycle:ignored_reports"

# States in which the job's processes should be running (or starting) on its nodes.
LIVE = (JobState.PLACED, JobState.RUNNING)
STOPPING = (JobState.CANCELLING, JobState.PREEMPTING)


class ForeignReport(Exception):
    """A node reported on a job it was never given: a bug or a lie, never applied."""


class NotAllowed(Exception):
    """The job is not in a state the requested change applies to; the message says why."""


@dataclass(frozen=True)
class Exit:
    """What a node says about the end of a run."""

    node: str
    launch_id: str | None
    exit_code: int | None
    finished_at: datetime
    error: str | None = None
    output_tail: str = ""
    oom: bool = False
    timed_out: bool = False
    requeue: bool = False  # its node ended it (agent restart/shutdown): run it again
    requeue_cause: str | None = None  # why, when not its agent stopping (``JobExited.requeue_cause``)
    absent: bool = False  # answer to a stop for a job the node does not run
    stopped: bool = False  # a stop (the control plane's, or its node's) ended it, not the job itself


# ---------------------------------------------------------------- the timeline


def _record(job_id: int, kind: str, message: str = "", *, node: str = "", attempt: int | None = None,
            at: datetime | None = None) -> JobEvent:
    """One step of the job's timeline, in the transaction of the change it records."""
    if attempt is None:
        attempt = Job.objects.filter(pk=job_id).values_list("attempt", flat=True).first() or 0
    return JobEvent.objects.create(job_id=job_id, attempt=attempt, kind=kind, at=at or timezone.now(), node=node[:63],
                                   message=message[:500])


def _gpus_text(decision: Place) -> str:
    return "; ".join(f"{s.node} GPU{'s' if len(s.gpu_indices) > 1 else ''} {','.join(map(str, s.gpu_indices))}"
                     for s in decision.slices)


def submitted(job: Job) -> JobEvent:
    """A new job's first step (its creation is the one state it is not moved into)."""
    return _record(job.pk, JobEventKind.SUBMITTED, f"By {job.owner.get_username()} to {job.tenant.slug}.", attempt=0,
            at=job.submitted_at)


def submitted_many(jobs: list[Job], message: str) -> None:
    """The first step of each job of an array; ``message`` may name ``{index}``."""
    JobEvent.objects.bulk_create([JobEvent(job_id=job.pk, attempt=0, kind=JobEventKind.SUBMITTED, at=job.submitted_at,
                                           message=message.format(index=job.array_index)[:500]) for job in jobs])


# ---------------------------------------------------------------- placement


# Rows per multi-row INSERT / UPDATE of a placement batch.
PLACE_BATCH_ROWS = 2000


@transaction.atomic
def place_many(decisions: list[Place], now: datetime, run_class: dict[int, str]) -> int:
    """PENDING -> PLACED as a new attempt, for each decision whose job is still pending: its GPUs
    allocated, its timeline told where and why, a launch sent to each of its nodes after commit.
    ``run_class``: job id -> how it was admitted. Returns how many were placed.

    Set-based, because a first cycle places thousands of jobs: a fixed handful of statements (a
    locking read, one UPDATE per class, multi-row inserts of allocations and events) and one
    Redis pipeline, whatever the count. A job cancelled since the snapshot is skipped."""
    by_id = {decision.job_id: decision for decision in decisions}
    if not by_id:
        return 0
    # Locked, so nothing moves them between this read and the update (SQLite: the write lock).
    placed = set(Job.objects.select_for_update().filter(pk__in=ids_in(by_id), state=JobState.PENDING)
                 .values_list("pk", flat=True))
    if not placed:
        return 0
    by_class: dict[str, list[int]] = {}
    for job_id in placed:
        by_class.setdefault(run_class[job_id], []).append(job_id)
    for job_class, job_ids in by_class.items():
        Job.objects.filter(pk__in=ids_in(job_ids)).update(
            state=JobState.PLACED, placed_at=now, started_at=None, reserved_since=None,
            run_class=job_class, attempt=F("attempt") + 1,
        )
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids_in(placed)).select_related(*LAUNCH_RELATED).only(*LAUNCH_FIELDS)}
    # How far off the first ETA each job was given turned out to be (+: started later).
    promised = dict(JobWait.objects.filter(job_id__in=ids_in(placed), first_eta_at__isnull=False)
                    .values_list("job_id", "first_eta_at"))
    first = [job for job in jobs.values() if job.attempt == 1 and job.pk in promised]
    for job in first:
        job.eta_error_s = now.timestamp() - promised[job.pk]
    Job.objects.bulk_update(first, ["eta_error_s"], batch_size=PLACE_BATCH_ROWS)
    waits.clear(placed)
    ordered = [(by_id[job_id], jobs[job_id]) for job_id in by_id if job_id in jobs]  # in the core's order
    insert_rows(Allocation, ("job_id", "gpu_id", "rank", "gpu_milli", "memory_limit_mib", "duty_cycle", "attempt",
                             "created_at"), [
        (job.pk, gpu_id, node_slice.node_rank, decision.gpu_milli, decision.memory_limit_mib, decision.duty_cycle,
         job.attempt, now)
        for decision, job in ordered for node_slice in decision.slices for gpu_id in node_slice.gpu_ids
    ])
    insert_rows(JobEvent, ("job_id", "attempt", "kind", "at", "node", "message"), [
        (job.pk, job.attempt, str(JobEventKind.PLACED), now, (decision.slices[0].node if decision.slices else "")[:63],
         (f"On {_gpus_text(decision)}, as {run_class[job.pk]}."
          + (f" {decision.note}" if getattr(decision, "note", "") else ""))[:500])
        for decision, job in ordered
    ])
    launches = []
    hosts = master_hosts([decision.rendezvous for decision, _ in ordered])
    for decision, job in ordered:
        envs = launch_envs(job.env, decision.slices, decision.rendezvous, hosts)
        launches.extend((node_slice.node, dict(
            job_id=job.pk, argv=job.command, gpu_indices=node_slice.gpu_indices, attempt=job.attempt,
            env=envs[node_slice.node], gpu_memory_limit_mib=decision.memory_limit_mib,
            duty_cycle=decision.duty_cycle, tenant=job.tenant.slug, max_runtime_s=job.max_runtime_s,
            **launch_spec(job, node_slice))) for node_slice in decision.slices)
    transaction.on_commit(lambda: publish_many(
        [(node, command) for node, launch in launches for command in launch_commands(node, **launch)]))
    return len(ordered)


# ---------------------------------------------------------------- what nodes report


def current_launch_id(job_id: int) -> str | None:
    attempt = Job.objects.filter(pk=job_id).values_list("attempt", flat=True).first()
    return None if attempt is None else launch_id(job_id, attempt)


def _on_node(job_id: int, node: str):
    allocations = Allocation.objects.filter(job_id=job_id, gpu__node__name=node)
    if not allocations.exists():
        raise ForeignReport(f"job {job_id} was never placed on node {node}")
    return allocations.filter(released_at__isnull=True)


def _ignored(job_id: int, node: str, what: str, why: str) -> None:
    log.info("job %s: %s from node %s ignored: %s", job_id, what, node, why)

    def count():
        try:
            get_redis().incr(IGNORED_REPORTS_KEY)
        except redis.RedisError:
            pass  # a counter, not a reason to fail the report

    transaction.on_commit(count)


@transaction.atomic
def start(job_id: int, node: str, launch: str | None, started_at: datetime) -> bool:
    """PLACED -> RUNNING when the current attempt's process started on one of its nodes."""
    live = _on_node(job_id, node)
    current = current_launch_id(job_id)
    if launch is not None and launch != current:
        # An earlier run started late (its launch was re-delivered): stop that run, only that one.
        _ignored(job_id, node, "start", f"{launch} is not the current attempt {current}; stopping it")
        transaction.on_commit(lambda: send_stop(node, job_id, launch))
        return False
    if not live.exists():
        # Started under an allocation that is gone (requeued or ended since): make it stop.
        _ignored(job_id, node, "start", "the job holds no GPUs there any more; stopping it")
        transaction.on_commit(lambda: send_stop(node, job_id, launch))
        return False
    if Job.objects.filter(pk=job_id, state=JobState.PLACED).update(state=JobState.RUNNING, started_at=started_at):
        _record(job_id, JobEventKind.STARTED, f"Its process started on {node}.", node=node, at=started_at)
        return True
    # Cancelled (or timed out) before it reported started: keep when it ran for the record.
    Job.objects.filter(pk=job_id, started_at__isnull=True).exclude(state=JobState.PENDING).update(
        started_at=started_at)
    return False


@transaction.atomic
def finish(job_id: int, exit: Exit) -> bool:
    """A run ended on ``exit.node``: settle the job's outcome for the current attempt and free
    the GPUs it held there. Returns True when GPUs were freed (worth a scheduling cycle)."""
    live = _on_node(job_id, exit.node)
    current = current_launch_id(job_id)
    if not live.exists() or (exit.launch_id is not None and exit.launch_id != current):
        late = _exit_after_requeue(job_id, exit)
        if late is not None:
            return late
    if not live.exists():
        _ignored(job_id, exit.node, "exit", "the job holds no GPUs there (requeued or settled since)")
        return False
    if exit.launch_id is not None and exit.launch_id != current:
        _ignored(job_id, exit.node, "exit", f"{exit.launch_id} is not the current attempt {current}")
        return False
    state, started_at = Job.objects.filter(pk=job_id).values_list("state", "started_at").get()
    if exit.absent and started_at is not None and exit.finished_at < started_at:
        # "Not here" said before the attempt started there (its node's clock both times): an
        # answer from before its launch arrived, replayed since (an agent re-sends what it said
        # when Redis comes back). Taken now, it requeued a job that ran, and so ran it twice.
        _ignored(job_id, exit.node, "absent-answer", "it was given before the attempt started there")
        return False
    if exit.absent and state == JobState.RUNNING and exit.launch_id == current:
        # Reconciliation asked the node about the running attempt and the node does not know it
        # (its agent lost it, its exit is gone for good): back to the queue now, not in a minute.
        requeue_now([job_id], reasons.vanished_from_node(exit.node, asked=True))
        return True
    if exit.absent and state == JobState.PLACED:
        # Asked about a placed attempt the node has not started: its launch is on the way, or
        # lost and re-sent by the scheduling loop. Nothing to settle.
        _ignored(job_id, exit.node, "absent-answer", "the placed attempt has not started there yet")
        return False
    if exit.absent and state in LIVE:
        # The node does not run it and was told to stop it, but this attempt is not being
        # stopped: the stop was for an earlier attempt. (A lost launch is re-sent instead.)
        _ignored(job_id, exit.node, "absent-answer", "the current attempt is not being stopped")
        return False
    if state in LIVE and launch_failures.is_start_failure(exit):
        exit = launch_failures.retry_elsewhere(job_id, exit)  # a node-local cause: another node
        if exit is None:
            return True
    outcome = _outcome(job_id, exit)
    if state == JobState.PREEMPTING and not exit.requeue and _final_state(exit) == JobState.SUCCEEDED:
        # Exit 0 during its preemption notice: it finished its work (before the stop reached it,
        # or in its grace), so it is done, not requeued to run a second time.
        if Job.objects.filter(pk=job_id, state=JobState.PREEMPTING).update(state=JobState.SUCCEEDED, **outcome):
            _record(job_id, JobEventKind.FINISHED, "Succeeded (exit code 0) during its preemption notice.",
                    node=exit.node, at=exit.finished_at)
            _ended(job_id, JobState.SUCCEEDED)
            from jobs.services.profiles import record_profile  # profiles reads usage; keep this module light

            record_profile(job_id)
    elif state == JobState.CANCELLING:
        if Job.objects.filter(pk=job_id, state=JobState.CANCELLING).update(state=JobState.CANCELLED, **outcome):
            _record(job_id, JobEventKind.FINISHED, f"Cancelled: its processes ended{_code(exit)}.", node=exit.node,
                    at=exit.finished_at)
            _ended(job_id, JobState.CANCELLED)
    elif state in LIVE and exit.requeue:
        if exit.requeue_cause == "gpu_sharing_fault":
            reason = reasons.gpu_sharing_fault(exit.node, exit.error or "its GPU's MPS server failed")
        else:
            reason = reasons.agent_restarted(exit.node)
        if Job.objects.filter(pk=job_id, state__in=LIVE).update(
            state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
        ):
            waits.set_reason([job_id], reason.as_dict())
            _record(job_id, JobEventKind.STOPPING, reason.message, node=exit.node, at=exit.finished_at)
    elif state in LIVE:
        final = _final_state(exit)
        if Job.objects.filter(pk=job_id, state__in=LIVE).update(state=final, **outcome):
            _record(job_id, JobEventKind.FINISHED, _final_words(final, exit, outcome["error"]), node=exit.node,
                    at=exit.finished_at)
            _ended(job_id, final)
            if final == JobState.SUCCEEDED:
                from jobs.services.profiles import record_profile  # profiles reads usage; keep this module light

                record_profile(job_id)
    elif state == JobState.TIMEOUT:
        # Timed out by the control plane's backstop; the node's report fills in what it knows.
        Job.objects.filter(pk=job_id, state=JobState.TIMEOUT, exit_code__isnull=True).update(
            exit_code=exit.exit_code, output_tail=exit.output_tail)
    live.update(released_at=timezone.now())
    # A job that had to be killed after its notice lost the run whatever it says about checkpoints.
    killed = exit.exit_code is None or exit.exit_code == -9
    _settle_if_stopped_everywhere(job_id, outcome.get("peak_gpu_memory_mib"), killed=killed)
    return True


def _exit_after_requeue(job_id: int, exit: Exit) -> bool | None:
    """An exit of an attempt that :func:`requeue_now` gave up without it (its node was lost, or
    stopped listing it), reported since: the run went on, or ended, unseen. None when the exit is
    not that (the caller ignores it as before), else what :func:`finish` returns.

    If it ran to its own end (:func:`_ran_to_its_end`) and no attempt has started since, that
    real exit wins over the requeue: the job ends with it (SUCCEEDED for exit 0), leaving the
    queue, and a later attempt placed meanwhile is stopped (its GPUs freed once its nodes
    confirm). Otherwise (a newer attempt started, or the run ended by a stop) the exit goes on the
    attempt's timeline, once per node, and changes nothing."""
    attempt = _attempt_of(job_id, exit.launch_id)
    if attempt is None or exit.absent:
        return None
    given_up = (JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.REQUEUED)
                .exclude(node="").order_by("-id").first())
    if given_up is None or JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.FINISHED,
                                                   node=exit.node[:63], id__gt=given_up.id).exists():
        return None
    job = Job.objects.select_for_update().filter(pk=job_id).values("state", "attempt").get()
    moved_on = JobEvent.objects.filter(job_id=job_id, attempt__gt=attempt, kind=JobEventKind.STARTED).exists()
    withdrawn = job["state"] in (JobState.PENDING, JobState.PLACED) and not moved_on
    if not (withdrawn and _ran_to_its_end(exit)):
        since = f"; attempt {job['attempt']} has started since" if moved_on else ""
        _record(job_id, JobEventKind.FINISHED, f"Its run on {exit.node} ended{_code(exit)} after it had been "
                f"requeued{since}: this changes nothing.", node=exit.node, attempt=attempt, at=exit.finished_at)
        _ignored(job_id, exit.node, "exit", f"{exit.launch_id} was requeued before this exit came")
        return False
    final, outcome = _final_state(exit), _outcome(job_id, exit)
    ran_from = (JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.STARTED)
                .values_list("at", flat=True).last())
    if not Job.objects.filter(pk=job_id, state=job["state"], attempt=job["attempt"]).update(
            state=final, started_at=ran_from, **outcome):
        return None
    placed = " Its new placement is withdrawn." if job["state"] == JobState.PLACED else ""
    _record(job_id, JobEventKind.FINISHED, f"{_final_words(final, exit, outcome['error'])} It had been requeued "
            f"({given_up.message[:200]}) but ran on to this end, which stands.{placed}", node=exit.node,
            attempt=attempt, at=exit.finished_at)
    _stop_on(job_id, live_nodes(job_id))  # (a later attempt placed meanwhile; its GPUs go once its nodes confirm)
    _ended(job_id, final)
    if final == JobState.SUCCEEDED:
        from jobs.services.profiles import record_profile  # profiles reads usage; keep this module light

        record_profile(job_id)
    return False  # (nothing freed now)


def _attempt_of(job_id: int, launch: str | None) -> int | None:
    """N of ``launch-<job_id>-<N>``, else None."""
    prefix = f"launch-{job_id}-"
    if launch is None or not launch.startswith(prefix) or not launch[len(prefix):].isdigit():
        return None
    return int(launch[len(prefix):])


def _ran_to_its_end(exit: Exit) -> bool:
    """Whether the exit is the run's own result, not one its stopping caused: it ended by itself
    (or was ended by its own runtime limit), or exited 0 when a stop came."""
    if exit.absent or exit.requeue or exit.exit_code is None:
        return False
    return not exit.stopped or exit.timed_out or _final_state(exit) == JobState.SUCCEEDED


def _code(exit: Exit) -> str:
    return "" if exit.exit_code is None else f" (exit code {exit.exit_code})"


def _final_words(final: str, exit: Exit, error: str) -> str:
    if final == JobState.SUCCEEDED:
        return "Succeeded (exit code 0)."
    if final == JobState.TIMEOUT:
        return error + "."
    return f"Failed{_code(exit)}" + (f": {error}" if error else ".")


def _final_state(exit: Exit) -> str:
    if exit.timed_out:
        return JobState.TIMEOUT
    if exit.exit_code == 0 and exit.error is None and not exit.oom:
        return JobState.SUCCEEDED
    return JobState.FAILED


def _outcome(job_id: int, exit: Exit) -> dict:
    from monitoring.models import JobUsage

    error = exit.error or ""
    if exit.oom:
        error = error or "Killed: out of GPU memory"
    if exit.timed_out:
        limit = Job.objects.filter(pk=job_id).values_list("max_runtime_s", flat=True).get()
        error = f"Stopped: ran longer than its runtime limit of {limit} s"
    return {
        "exit_code": exit.exit_code,
        "output_tail": exit.output_tail,
        "error": error,
        "finished_at": exit.finished_at,
        "peak_gpu_memory_mib": JobUsage.objects.filter(job_id=job_id)
        .values_list("peak_gpu_memory_mib", flat=True).first(),
    }


def _settle_if_stopped_everywhere(job_id: int, peak_mib: int | None, *, killed: bool = True) -> None:
    """After one node's GPUs are freed: a gang's other nodes are told to stop a job that is over
    (or going back to the queue); a preempted job stopped everywhere returns to the queue, and what
    its run is worth is written down: nothing lost if it checkpoints and ended within its notice,
    else the whole run (the last node's exit decides for a gang)."""
    others = live_nodes(job_id)
    if not others:
        run = Job.objects.filter(pk=job_id, state=JobState.PREEMPTING).values("started_at", "checkpoints").first()
        if run is None:
            return
        ran_s = (timezone.now() - run["started_at"]).total_seconds() if run["started_at"] else 0.0
        saved = run["checkpoints"] and not killed
        lost_s = 0.0 if saved else max(0.0, ran_s)
        if Job.objects.filter(pk=job_id, state=JobState.PREEMPTING).update(
            state=JobState.PENDING, placed_at=None, started_at=None, peak_gpu_memory_mib=peak_mib,
            lost_work_s=F("lost_work_s") + lost_s,
        ):
            _record(job_id, JobEventKind.REQUEUED, "Stopped on every node; waiting to be placed again. "
                    + _work_words(ran_s, saved, run["checkpoints"]))
        return
    _stop_on(job_id, others)


def _work_words(ran_s: float, saved: bool, checkpoints: bool) -> str:
    ran = reasons.duration(ran_s)
    if not ran_s:
        # No start report reached us: it may have run (the report lost), so claim nothing.
        return "No start of it was reported, so no work is known to be lost."
    if saved:
        return f"It ran {ran} and ended within its notice, so its checkpoint keeps that work."
    if checkpoints:
        return f"It was killed when its notice ran out: {ran} of work may be lost."
    return f"{ran[0].upper()}{ran[1:]} of work lost (it does not checkpoint)."


# ---------------------------------------------------------------- endings


def _ended(job_id: int, state: str, *, tell_as: str | None = None) -> None:
    """What follows a job's end, in the transaction that ended it (see :func:`_ended_many`)."""
    _ended_many([job_id], state, tell_as=tell_as)


def _ended_many(job_ids: list[int], state: str, *, tell_as: str | None = None) -> None:
    """What follows these jobs' end (each ``state``), in the transaction that ended them: jobs
    that ran ``after_ok`` one of them can never start unless it succeeded, so they end too (and
    theirs, down the chain); owners hear of it if they asked to (``tell_as``: the event they hear,
    when not the state itself)."""
    if not job_ids:
        return
    waits.clear(job_ids)
    _notify_many(job_ids, tell_as or state.lower())
    if state != JobState.SUCCEEDED:
        _cancel_after_ok_chain(job_ids, state)


def _cancel_after_ok_chain(ended: list[int], state: str) -> None:
    """Cancel every pending job that ran ``after_ok`` one of ``ended`` (which ended ``state``),
    and theirs, down the chain. A chain is cut a level at a time with a fixed handful of
    statements per level (a locking read, one UPDATE, one multi-row INSERT), never one per job:
    a sweep of a thousand dependants is cancelled in the request that ended its root. Each
    dependant's error and timeline name the job it ran after."""
    causes = dict.fromkeys(ended, state.lower())  # job id -> how it ended
    now = timezone.now()
    while causes:
        doomed: dict[int, tuple[int, int]] = {}  # dependant -> (its attempt, the job it ran after)
        for dependant, attempt, on in (
                Job.objects.select_for_update(of=("self",))
                .filter(state=JobState.PENDING, dependencies__kind=JobDependency.Kind.OK,
                        dependencies__on_id__in=ids_in(causes))
                .order_by("pk").values_list("pk", "attempt", "dependencies__on_id")):
            doomed.setdefault(dependant, (attempt, on))  # (one that waits on several: the first)
        if not doomed:
            return
        words = {job_id: f"Cancelled: job {on}, which it ran after (after_ok), ended {causes[on]}."
                 for job_id, (_, on) in doomed.items()}
        by_words: dict[str, list[int]] = {}
        for job_id, text in words.items():
            by_words.setdefault(text, []).append(job_id)
        # Locked above, so every one of them is still pending: one UPDATE, its error per cause.
        Job.objects.filter(pk__in=ids_in(doomed), state=JobState.PENDING).update(
            state=JobState.CANCELLED, finished_at=now,
            error=Case(*[When(pk__in=ids_in(ids), then=Value(text)) for text, ids in by_words.items()],
                       default=Value(""), output_field=CharField()))
        JobEvent.objects.bulk_create(
            [JobEvent(job_id=job_id, attempt=attempt, kind=JobEventKind.FINISHED, at=now, message=words[job_id][:500])
             for job_id, (attempt, _) in doomed.items()], batch_size=1000)
        waits.clear(doomed)
        # Nobody cancelled them: to their owners this is a failure, and opted-in failures are told.
        _notify_many(list(doomed), "failed")
        causes = dict.fromkeys(doomed, JobState.CANCELLED.lower())


def _notify(job_id: int, event: str) -> None:
    from jobs.services import notifications  # optional per user; keep the lifecycle importable alone

    notifications.job_event(job_id, event)


def _notify_many(job_ids: list[int], event: str) -> None:
    """:func:`_notify` for each job whose owner opted in to ``event``: found in one query, so a
    chain of a thousand jobs whose owner asked for nothing costs one query, not a thousand."""
    if len(job_ids) == 1:
        _notify(job_ids[0], event)
        return
    from jobs.services import notifications

    opt_in = notifications.OPT_IN.get(event)
    if opt_in is None:  # (cancelled: the user asked for it; nobody is told)
        return
    owners = (Job.objects.filter(pk__in=ids_in(job_ids), owner__notification_settings__isnull=False)
              .values_list("pk", "owner__notification_settings__events"))
    for job_id, events in owners:
        if opt_in in (events or []):
            _notify(job_id, event)


# ---------------------------------------------------------------- stopping


def live_nodes(job_id: int) -> set[str]:
    return set(Allocation.objects.filter(job_id=job_id, released_at__isnull=True)
               .values_list("gpu__node__name", flat=True))


def _stop_on(job_id: int, nodes, *, notice: bool = False) -> None:
    """Tell ``nodes`` to stop the job's current attempt (and only that one). ``notice``: it goes
    back to the queue, so it gets its preemption notice (its ``preempt_grace_s``, within the
    operator's ceiling) and the deadline in its ``COLONY_PREEMPT_FILE``."""
    current = current_launch_id(job_id)
    grace = None
    if notice:
        asked = Job.objects.filter(pk=job_id).values_list("preempt_grace_s", flat=True).first()
        grace = min(float(settings.COLONY_STOP_GRACE_SECONDS if asked is None else asked),
                    float(settings.COLONY_MAX_PREEMPT_GRACE_S))
    for node in nodes:
        transaction.on_commit(lambda node=node: send_stop(node, job_id, current, preempt_grace_s=grace))


@dataclass(frozen=True)
class CancelOutcome:
    """What :func:`begin_cancel_many` did to each job it was given."""

    cancelled: tuple[int, ...]  # were pending: ended at once
    stopping: tuple[int, ...]  # were placed, running or preempted: their nodes were told to stop them
    unchanged: dict[int, str]  # could not be cancelled (ended already, being cancelled): id -> state


@transaction.atomic
def begin_cancel(job_id: int) -> str:
    """A user's cancel: a pending job ends at once, a placed or running one is stopped first.
    Returns the new state; raises :class:`NotAllowed` for a job that already ended."""
    outcome = begin_cancel_many([job_id])
    if outcome.cancelled:
        return JobState.CANCELLED
    if outcome.stopping:
        return JobState.CANCELLING
    raise NotAllowed(f"job {job_id} is {str(outcome.unchanged.get(job_id)).lower()} and cannot be cancelled")


@transaction.atomic
def begin_cancel_many(job_ids) -> CancelOutcome:
    """Users' cancel of these jobs (whoever may cancel them is the caller's business): pending
    ones end at once, placed, running or preempted ones are stopped first, in one transaction of
    a fixed handful of statements however many jobs (and dependants, :func:`_cancel_after_ok_chain`)."""
    job_ids = list(dict.fromkeys(job_ids))
    now = timezone.now()
    rows = list(Job.objects.select_for_update().filter(pk__in=ids_in(job_ids)).order_by("pk")
                .values_list("pk", "state", "attempt"))
    pending = {pk: attempt for pk, state, attempt in rows if state == JobState.PENDING}
    stopping = {pk: attempt for pk, state, attempt in rows if state in (*LIVE, JobState.PREEMPTING)}
    unchanged = {pk: state for pk, state, _ in rows if pk not in pending and pk not in stopping}
    if pending:
        Job.objects.filter(pk__in=ids_in(pending), state=JobState.PENDING).update(
            state=JobState.CANCELLED, finished_at=now)
    if stopping:
        Job.objects.filter(pk__in=ids_in(stopping), state__in=(*LIVE, JobState.PREEMPTING)).update(
            state=JobState.CANCELLING)
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=pk, attempt=attempt, kind=JobEventKind.FINISHED, at=now,
                  message="Cancelled while waiting in the queue.") for pk, attempt in pending.items()]
        + [JobEvent(job_id=pk, attempt=attempt, kind=JobEventKind.STOPPING, at=now,
                    message="Cancel requested; its nodes were told to stop it.")
           for pk, attempt in stopping.items()],
        batch_size=1000)
    _ended_many(list(pending), JobState.CANCELLED)
    if stopping:
        for job_id, node in set(Allocation.objects.filter(job_id__in=ids_in(stopping), released_at__isnull=True)
                                .values_list("job_id", "gpu__node__name")):
            current = launch_id(job_id, stopping[job_id])
            transaction.on_commit(lambda node=node, job_id=job_id, current=current: send_stop(node, job_id, current))
    return CancelOutcome(tuple(pending), tuple(stopping), unchanged)


@transaction.atomic
def begin_preempt(job_id: int, message: str) -> bool:
    """Stop an opportunistic job to make room; it returns to the queue once every node stopped it."""
    if not Job.objects.filter(pk=job_id, state__in=LIVE, run_class=RunClass.OPPORTUNISTIC).update(
        state=JobState.PREEMPTING, preempt_count=F("preempt_count") + 1,
    ):
        return False
    waits.set_reason([job_id], reasons.preempted(message).as_dict())
    _record(job_id, JobEventKind.STOPPING, f"Preempted: {message}")
    _stop_on(job_id, live_nodes(job_id), notice=True)
    _notify(job_id, "preempted")
    return True


@transaction.atomic
def begin_requeue(job_id: int, by: str) -> None:
    """An operator sends a placed or running job back to the queue (its place in it kept)."""
    if not Job.objects.filter(pk=job_id, state__in=LIVE).update(
        state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
    ):
        state = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
        raise NotAllowed(f"job {job_id} is {str(state).lower()}; only placed or running jobs can be requeued")
    waits.set_reason([job_id], reasons.requeued_by_operator(by).as_dict())
    _record(job_id, JobEventKind.STOPPING, f"Requeued by operator {by}; its nodes were told to stop it.")
    _stop_on(job_id, live_nodes(job_id), notice=True)


@transaction.atomic
def time_out(job_id: int, started_before: datetime) -> bool:
    """The control plane's backstop for a runtime limit its node did not enforce (an old agent,
    a lost launch field): the job ends TIMEOUT now and its nodes are told to stop it; its GPUs
    stay held until they confirm. Fenced on the run it judged (``started_at``)."""
    limit = Job.objects.filter(pk=job_id).values_list("max_runtime_s", flat=True).first()
    error = f"Stopped by the control plane: ran longer than its runtime limit of {limit} s"
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, started_at__lt=started_before).update(
        state=JobState.TIMEOUT, finished_at=timezone.now(), error=error,
    ):
        return False
    _record(job_id, JobEventKind.FINISHED, error + "; its nodes were told to stop it.")
    _stop_on(job_id, live_nodes(job_id))
    _ended(job_id, JobState.TIMEOUT)
    log.warning("job %s ran past its runtime limit of %s s; stopping it", job_id, limit)
    return True


# ---------------------------------------------------------------- losing nodes


@transaction.atomic
def requeue_now(job_ids, reason: PendingReason, *, only_running: bool = False) -> list[int]:
    """Its node is gone (lost, or no longer runs it): release the jobs' GPUs everywhere at once
    and settle each without waiting for an exit that will never come. Live jobs go back to the
    queue (requeue counted), cancelling ones end CANCELLED, preempted ones return to the queue.
    ``only_running``: requeue only jobs that are RUNNING (a placed job's launch may be in flight).
    Returns the ids requeued."""
    job_ids = list(job_ids)
    now = timezone.now()
    live_states = (JobState.RUNNING,) if only_running else LIVE
    requeued = list(Job.objects.filter(pk__in=job_ids, state__in=live_states).values_list("pk", flat=True))
    if only_running and not requeued:
        return []
    if only_running:
        job_ids = requeued
    stops = set(Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True)
                .values_list("job_id", "gpu__node__name", "job__attempt"))
    cancelled = list(Job.objects.filter(pk__in=job_ids, state=JobState.CANCELLING).values_list("pk", flat=True))
    stopped = list(Job.objects.filter(pk__in=job_ids, state=JobState.PREEMPTING).values_list("pk", flat=True))
    Job.objects.filter(pk__in=requeued).update(
        state=JobState.PENDING, placed_at=None, started_at=None, requeue_count=F("requeue_count") + 1,
    )
    waits.set_reason(requeued, reason.as_dict())
    Job.objects.filter(pk__in=cancelled, state=JobState.CANCELLING).update(state=JobState.CANCELLED, finished_at=now)
    Job.objects.filter(pk__in=stopped, state=JobState.PREEMPTING).update(
        state=JobState.PENDING, placed_at=None, started_at=None)
    attempts = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "attempt"))
    # Each REQUEUED step names the node: it marks the attempt as given up without its exit, so an
    # exit of it reported later is weighed, not dropped (``_exit_after_requeue``).
    node = reason.details.get("node", "")
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=j, attempt=attempts.get(j, 0), kind=JobEventKind.REQUEUED, at=now, node=node,
                  message=reason.message) for j in [*requeued, *stopped]]
        + [JobEvent(job_id=j, attempt=attempts.get(j, 0), kind=JobEventKind.FINISHED, at=now, node=node,
                    message="Cancelled; its node never confirmed the stop (" + reason.message + ")")
           for j in cancelled])
    Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True).update(released_at=now)
    for job_id in cancelled:
        _ended(job_id, JobState.CANCELLED)
    # Wherever a process of theirs may still run (a gang's other nodes, a node that comes back).
    for job_id, node, attempt in stops:
        transaction.on_commit(lambda node=node, job_id=job_id, attempt=attempt:
                              send_stop(node, job_id, launch_id(job_id, attempt)))
    return requeued


# ---------------------------------------------------------------- idle-GPU reclaim (jobs/services/idle_reclaim.py)

# How each idle step's timeline entry begins: the reclaim service reads them back to take each
# step once per idle spell.
IDLE_STEP_WORDS = {"notify": "Warned: ", "opportunistic": "Made opportunistic: ", "suspend": "Suspended: "}


def _idle_running(job_id: int, attempt: int):
    """The job's row, locked, when it still runs ``attempt``; else None."""
    return Job.objects.select_for_update().filter(pk=job_id, state=JobState.RUNNING, attempt=attempt).first()


def _idle_step_taken(job_id: int, attempt: int, step: str, since: datetime) -> bool:
    return JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.IDLE, at__gte=since,
                                   message__startswith=IDLE_STEP_WORDS[step]).exists()


@transaction.atomic
def idle_warn(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy, first step: nothing changes but the owner is warned, once per idle spell
    (``since``: when it began; ``at``: when it was judged, the timeline's time)."""
    if _idle_running(job_id, attempt) is None or _idle_step_taken(job_id, attempt, "notify", since):
        return False
    _record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["notify"] + figures, attempt=attempt, at=at)
    _notify(job_id, "idle_warned")
    return True


@transaction.atomic
def mark_opportunistic(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy: a running guaranteed job becomes opportunistic (it keeps running and its GPUs;
    it may now be packed next to, throttled or preempted, and its tenant's guarantee frees)."""
    if _idle_running(job_id, attempt) is None:
        return False
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, attempt=attempt,
                              run_class=RunClass.GUARANTEED).update(run_class=RunClass.OPPORTUNISTIC):
        return False
    _record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["opportunistic"] + figures
            + " It keeps running, but may now be preempted.", attempt=attempt, at=at)
    _notify(job_id, "idle_demoted")
    return True


@transaction.atomic
def suspend_idle(job_id: int, attempt: int, since: datetime, figures: str, at: datetime) -> bool:
    """Idle policy: stop a running job's processes (SIGSTOP, by a SuspendJob to each of its nodes),
    once per idle spell. Its state and GPUs stay as they are: its GPU memory is still held. The
    scheduler's allocations keep their duty cycle, so no throttle decision resumes it; the idle
    policy's requeue (or a cancel) ends it."""
    if _idle_running(job_id, attempt) is None or _idle_step_taken(job_id, attempt, "suspend", since):
        return False
    from jobs.services.commands import send_duty_cycle  # duty cycle 0 is the SuspendJob command

    _record(job_id, JobEventKind.IDLE, IDLE_STEP_WORDS["suspend"] + figures
            + " Its processes are stopped; its GPU memory stays held until it is requeued or cancelled.",
            attempt=attempt, at=at)
    for node in sorted(live_nodes(job_id)):
        transaction.on_commit(lambda node=node: send_duty_cycle(node, job_id, 0.0))
    _notify(job_id, "idle_suspended")
    return True


@transaction.atomic
def requeue_idle(job_id: int, attempt: int, figures: str, at: datetime, *, idle_minutes: int) -> bool:
    """Idle policy, last step: the running job is stopped (with its preemption notice) and goes
    back to the queue, its GPUs freed once its nodes confirm."""
    reason = reasons.idle_requeued(figures, idle_minutes)
    if not Job.objects.filter(pk=job_id, state=JobState.RUNNING, attempt=attempt).update(
        state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
    ):
        return False
    waits.set_reason([job_id], reason.as_dict())
    _record(job_id, JobEventKind.STOPPING, f"Requeued: {figures} Its nodes were told to stop it.", attempt=attempt,
            at=at)
    _stop_on(job_id, live_nodes(job_id), notice=True)
    _notify(job_id, "idle_requeued")
    return True
