"""What nodes report about a run: it started (PLACED -> RUNNING), or it ended, which settles the
job's outcome for its attempt (SUCCEEDED, FAILED, TIMEOUT; CANCELLED after a cancel; back to the
queue after a preemption, a node-local start failure or its agent stopping) and frees its GPUs
there. A report for an attempt that is not the current one changes nothing but a counter,
except the real exit of an attempt given up with its node (:func:`_exit_after_requeue`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import redis
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobEventKind, JobState
from jobs.models import Allocation, Job, JobEvent
from jobs.scheduling import reasons
from jobs.services import launch_failures, waits
from jobs.services.commands import send_stop
from jobs.services.lifecycle.endings import ended
from jobs.services.lifecycle.requeue import requeue_now
from jobs.services.lifecycle.states import LIVE, current_launch_id, live_nodes
from jobs.services.lifecycle.stopping import stop_on
from jobs.services.lifecycle.timeline import record
from jobs.services.profiles import record_profile
from monitoring.models import JobUsage
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

IGNORED_REPORTS_KEY = "colony:lifecycle:ignored_reports"


class ForeignReport(Exception):
    """A node reported on a job it was never given: a bug or a lie, never applied."""


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
        record(job_id, JobEventKind.STARTED, f"Its process started on {node}.", node=node, at=started_at)
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
        exit = launch_failures.retry_elsewhere(job_id, exit, requeue_now)  # a node-local cause: another node
        if exit is None:
            return True
    outcome = _outcome(job_id, exit)
    if state == JobState.PREEMPTING and not exit.requeue and _final_state(exit) == JobState.SUCCEEDED:
        # Exit 0 during its preemption notice: it finished its work (before the stop reached it,
        # or in its grace), so it is done, not requeued to run a second time.
        if Job.objects.filter(pk=job_id, state=JobState.PREEMPTING).update(state=JobState.SUCCEEDED, **outcome):
            record(job_id, JobEventKind.FINISHED, "Succeeded (exit code 0) during its preemption notice.",
                    node=exit.node, at=exit.finished_at)
            ended(job_id, JobState.SUCCEEDED)
            record_profile(job_id)
    elif state == JobState.CANCELLING:
        if Job.objects.filter(pk=job_id, state=JobState.CANCELLING).update(state=JobState.CANCELLED, **outcome):
            record(job_id, JobEventKind.FINISHED, f"Cancelled: its processes ended{_code(exit)}.", node=exit.node,
                    at=exit.finished_at)
            ended(job_id, JobState.CANCELLED)
    elif state in LIVE and exit.requeue:
        if exit.requeue_cause == "gpu_sharing_fault":
            reason = reasons.gpu_sharing_fault(exit.node, exit.error or "its GPU's MPS server failed")
        else:
            reason = reasons.agent_restarted(exit.node)
        if Job.objects.filter(pk=job_id, state__in=LIVE).update(
            state=JobState.PREEMPTING, requeue_count=F("requeue_count") + 1,
        ):
            waits.set_reason([job_id], reason.as_dict())
            record(job_id, JobEventKind.STOPPING, reason.message, node=exit.node, at=exit.finished_at)
    elif state in LIVE:
        final = _final_state(exit)
        if Job.objects.filter(pk=job_id, state__in=LIVE).update(state=final, **outcome):
            record(job_id, JobEventKind.FINISHED, _final_words(final, exit, outcome["error"]), node=exit.node,
                    at=exit.finished_at)
            ended(job_id, final)
            if final == JobState.SUCCEEDED:
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

    If it ran to its own end (:func:`_ran_to_its_end`) while the job waits, is placed or runs again,
    that real exit wins over the requeue: the job's work is done, so it ends with it (SUCCEEDED for
    exit 0), and a later attempt placed or started meanwhile is stopped (its GPUs freed once its
    nodes confirm): run on, it would complete the job a second time. Otherwise (the run ended by a
    stop, or the job is being stopped or has ended) the exit goes on the attempt's timeline, once
    per node, and changes nothing."""
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
    withdrawn = job["state"] in (JobState.PENDING, JobState.PLACED, JobState.RUNNING)
    if not (withdrawn and _ran_to_its_end(exit)):
        since = f"; attempt {job['attempt']} has started since" if moved_on else ""
        record(job_id, JobEventKind.FINISHED, f"Its run on {exit.node} ended{_code(exit)} after it had been "
                f"requeued{since}: this changes nothing.", node=exit.node, attempt=attempt, at=exit.finished_at)
        _ignored(job_id, exit.node, "exit", f"{exit.launch_id} was requeued before this exit came")
        return False
    final, outcome = _final_state(exit), _outcome(job_id, exit)
    ran_from = (JobEvent.objects.filter(job_id=job_id, attempt=attempt, kind=JobEventKind.STARTED)
                .values_list("at", flat=True).last())
    if not Job.objects.filter(pk=job_id, state=job["state"], attempt=job["attempt"]).update(
            state=final, started_at=ran_from, **outcome):
        return None
    placed = {JobState.PLACED: " Its new placement is withdrawn.",
              JobState.RUNNING: f" Attempt {job['attempt']}, started since, is stopped."}.get(job["state"], "")
    record(job_id, JobEventKind.FINISHED, f"{_final_words(final, exit, outcome['error'])} It had been requeued "
            f"({given_up.message[:200]}) but ran on to this end, which stands.{placed}", node=exit.node,
            attempt=attempt, at=exit.finished_at)
    stop_on(job_id, live_nodes(job_id))  # (a later attempt placed meanwhile; its GPUs go once its nodes confirm)
    ended(job_id, final)
    if final == JobState.SUCCEEDED:
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
            record(job_id, JobEventKind.REQUEUED, "Stopped on every node; waiting to be placed again. "
                    + _work_words(ran_s, saved, run["checkpoints"]))
        return
    stop_on(job_id, others)


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
