"""What must hold at every step of a simulated run, whatever the faults. Each check returns the
violations it found (words that say which job, node or GPU and how), empty when all is well.

- no attempt completes twice: a job's work runs to its own end at most once (a job that
  completed is never run again to completion, under whatever attempt). The one run again by
  design is excused: the earlier run's node was declared LOST while it ran (silent past the
  grace) and its exit had not reached Redis when the next attempt's launch reached its node (from
  then on that node may start it at any moment): the control plane could not know in time that the
  run had ended (:func:`excused`);
- no GPU held by two live attempts: on each node, at most one live run uses each GPU;
- a job's reported exit is its real exit: a job settled SUCCEEDED or FAILED carries the exit code
  of a run of it that ran to its end, and a job whose run ran to its end settles with that code;
- every job reaches a final state (checked at the end, after faults stop and time runs on).
"""

from __future__ import annotations

from collections import Counter

from jobs.choices import JobState
from jobs.models import Job
from tests.simulation.control_plane import FINAL


def completed_twice(completions: dict[int, list], lost_at: dict[str, list[float]],
                    delivered_at: dict[tuple[int, str], float], launched_at: dict[str, float]) -> list[str]:
    found = []
    for job_id, runs in completions.items():
        for earlier, later in zip(runs, runs[1:]):
            if not excused(earlier, later, lost_at, delivered_at, launched_at):
                found.append(f"job {job_id} completed twice: {earlier.launch.command_id} on {earlier.node}, "
                             f"then {later.launch.command_id} on {later.node}")
    return found


def excused(earlier, later, lost_at: dict[str, list[float]], delivered_at: dict[tuple[int, str], float],
            launched_at: dict[str, float]) -> bool:
    """Whether ``later`` ran again only because ``earlier``'s node was lost with its exit unsent.
    ``launched_at``: launch command id -> when it first reached its node's command stream."""
    lost_while_running = any(earlier.started_at <= when <= later.started_at for when in lost_at.get(earlier.node, ()))
    launched = launched_at.get(later.launch.command_id, later.started_at)
    exit_known = delivered_at.get((earlier.job_id, earlier.launch.command_id), float("inf")) <= launched
    return lost_while_running and not exit_known


def gpus_held_twice(processes) -> list[str]:
    """``processes``: every live simulated run, of every node."""
    holders = Counter((p.node, index) for p in processes for index in p.gpu_indices)
    found = []
    for (node, index), count in holders.items():
        if count > 1:
            runs = [p.launch.command_id for p in processes if p.node == node and index in p.gpu_indices]
            found.append(f"GPU {index} of {node} held by {count} live runs: {', '.join(runs)}")
    return found


def exits_misreported(completions: dict[int, list]) -> list[str]:
    found = []
    for job_id, state, exit_code in Job.objects.filter(state__in=FINAL).values_list("pk", "state", "exit_code"):
        runs = completions.get(job_id, [])
        real = runs[0].exit_code if runs else None
        if state in (JobState.SUCCEEDED, JobState.FAILED):
            if not runs:
                found.append(f"job {job_id} settled {state} (exit {exit_code}) but no run of it ran to its end")
            elif exit_code != real:
                found.append(f"job {job_id} settled {state} with exit {exit_code}; its real exit was {real}")
        elif runs:
            found.append(f"job {job_id} settled {state} but a run of it ended by itself with exit {real}")
    return found


def not_final() -> list[str]:
    return [f"job {job_id} never reached a final state (it is {state}, attempt {attempt})"
            for job_id, state, attempt in Job.objects.exclude(state__in=FINAL).values_list("pk", "state", "attempt")]
