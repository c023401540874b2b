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

Its modules, by what they do: :mod:`.placement` (PENDING -> PLACED), :mod:`.node_reports` (what
nodes say: started, ended; the outcome settled), :mod:`.stopping` (cancel, preempt, operator
requeue, runtime backstop), :mod:`.requeue` (a node lost), :mod:`.idle` (the idle-GPU policy's
steps); and what they share: :mod:`.states` (what each change is fenced on), :mod:`.timeline`,
:mod:`.endings` (what follows an end: ``after_ok`` chains cancelled, owners told). Callers import
this package; the names below are its interface.
"""

from jobs.services.lifecycle.idle import IDLE_STEP_WORDS, idle_warn, mark_opportunistic, requeue_idle, suspend_idle
from jobs.services.lifecycle.node_reports import IGNORED_REPORTS_KEY, Exit, ForeignReport, finish, start
from jobs.services.lifecycle.placement import PLACE_BATCH_ROWS, place_many
from jobs.services.lifecycle.requeue import requeue_now
from jobs.services.lifecycle.states import LIVE, STOPPING, current_launch_id, live_nodes
from jobs.services.lifecycle.stopping import (CancelOutcome, NotAllowed, begin_cancel, begin_cancel_many,
                                              begin_preempt, begin_requeue, time_out)
from jobs.services.lifecycle.timeline import submitted, submitted_many

__all__ = [
    "IDLE_STEP_WORDS", "IGNORED_REPORTS_KEY", "LIVE", "PLACE_BATCH_ROWS", "STOPPING", "CancelOutcome", "Exit",
    "ForeignReport", "NotAllowed", "begin_cancel", "begin_cancel_many", "begin_preempt", "begin_requeue",
    "current_launch_id", "finish", "idle_warn", "live_nodes", "mark_opportunistic", "place_many", "requeue_idle",
    "requeue_now", "start", "submitted", "submitted_many", "suspend_idle", "time_out",
]
