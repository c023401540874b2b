"""AntMan-style computation scaling: duty cycles of opportunistic jobs, set by AIMD from live use.

Per GPU that an opportunistic job runs on, one signal:

* **decrease** (multiply by ``duty_cycle_decrease_factor``) when a guaranteed neighbour is slowed
  (its live utilisation below its solo profile by more than the fraction ``slowdown_margin`` of
  it: the promise is relative, and a margin in utilisation points let a neighbour at 6% solo
  utilisation run 75% slower on Philly from 2017-12-08), when the GPU is
  saturated (utilisation >= ``saturated_utilisation``) while a guaranteed job is on it, or when a
  guaranteed job was placed on it this cycle (act before the slowdown shows up);
* **increase** (add ``duty_cycle_increase``) when the GPU's utilisation is known and below
  ``room_utilisation`` and every guaranteed neighbour with a profile runs within ``raise_margin``
  of it (a dead band: between ``raise_margin`` and ``slowdown_margin`` the duty cycle holds, so
  AIMD settles next to a neighbour that interference slows instead of sawing up and down);
* **back to full speed** (``duty_cycle_ceiling`` at once) when no guaranteed job shares the GPU
  any more: the slow additive probe exists to find how much a guaranteed neighbour can spare, and
  with none left there is nothing to probe;
* **hold** otherwise (no reading yet: do nothing rather than guess).

Guaranteed residents that are being stopped (cancelling, ended but not yet confirmed by their
node: ``leaving``) are not neighbours to protect. They used to be: while one wound down (its
utilisation falling far below its profile as it exits, or no reading at all) it kept its
borrowing neighbours halved, then suspended, for as long as its stop took, and what was left
climbed back 0.1 a cycle (the review's "7 A100s at 19% while 13 GPUs were idle").

**Least served first among borrowers.** A GPU shared only by one-GPU borrowers whose live load
reaches ``saturated_utilisation`` runs its least served borrower (by its earlier runs, then the
one started last) at the ceiling and the others at ``borrower_yield_duty``: the order least
attained service gives across GPUs (``turnover``), inside one, without leaving it idle. They stay
yielded while the GPU would saturate with them back at the ceiling (their live use scaled up to
it), and go back to it when it would not.

A job on several GPUs decreases if any GPU says so and increases only if all do (to full speed
only if none of its GPUs has a guaranteed neighbour). Duty cycles stay
within [floor, ceiling], except that a job at the floor told to decrease again is suspended
(duty cycle 0, ``suspend_at_floor``) and comes back at the floor's level once its GPUs have room
(0 + increase). A Throttle is emitted only when the value changes. Jobs that are being
stopped are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobs.scheduling.capacity import Capacity, GpuSlot
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Throttle, ThrottleReason
from jobs.scheduling.snapshot import JobClass, RunningJob

_DECREASE = (ThrottleReason.NEIGHBOUR_SLOWED, ThrottleReason.GPU_SATURATED, ThrottleReason.GUARANTEED_JOB_PLACED)
_RAISE = (ThrottleReason.ROOM_AVAILABLE, ThrottleReason.NO_GUARANTEED_NEIGHBOUR)
_UNASKED = object()


def _signal(gpu: GpuSlot, config: SchedulerConfig, leaving: set[int],
            utilisation: Mapping[int, float]) -> ThrottleReason | None:
    guaranteed = [j for j in gpu.residents if j.job_class is JobClass.GUARANTEED and j.id not in leaving]
    for job in guaranteed:
        if (job.solo_utilisation is not None and (live := utilisation.get(job.id)) is not None
                and live < job.solo_utilisation * (1 - config.slowdown_margin)):
            return ThrottleReason.NEIGHBOUR_SLOWED
    if ((guaranteed or gpu.placed_guaranteed) and gpu.live_load is not None
            and gpu.live_load >= config.saturated_utilisation):
        return ThrottleReason.GPU_SATURATED
    if gpu.placed_guaranteed:
        return ThrottleReason.GUARANTEED_JOB_PLACED
    if not guaranteed:
        return ThrottleReason.NO_GUARANTEED_NEIGHBOUR
    if gpu.live_load is not None and gpu.live_load < config.room_utilisation and all(
            job.solo_utilisation is None or (live := utilisation.get(job.id)) is None
            or live >= job.solo_utilisation * (1 - config.raise_margin) for job in guaranteed):
        return ThrottleReason.ROOM_AVAILABLE
    return None


def throttles(capacity: Capacity, running: tuple[RunningJob, ...], utilisation: Mapping[int, float],
              leaving: set[int], config: SchedulerConfig) -> list[Throttle]:
    """``utilisation``: each running job's live reading (``LiveReadings.jobs``)."""
    decisions: list[Throttle] = []
    signals: dict[int, ThrottleReason | None] = {}
    by_id, opportunistic = capacity.by_id, JobClass.OPPORTUNISTIC
    for job in running:
        if job.job_class is not opportunistic or job.id in leaving:
            continue
        reasons = []
        for gpu_id in job.gpu_ids:
            gpu = by_id.get(gpu_id)
            if gpu is None:
                continue
            signal = signals.get(gpu_id, _UNASKED)
            if signal is _UNASKED:
                signal = signals[gpu_id] = _signal(gpu, config, leaving, utilisation)
            reasons.append(signal)
        if not reasons:
            continue
        if len(reasons) == 1:  # (most jobs: one GPU, one signal)
            only = reasons[0]
            decrease = only if only in _DECREASE else None
            to_ceiling = only is ThrottleReason.NO_GUARANTEED_NEIGHBOUR
            to_raise = only in _RAISE
        else:
            decrease = next((r for r in reasons if r in _DECREASE), None)
            to_ceiling = all(r is ThrottleReason.NO_GUARANTEED_NEIGHBOUR for r in reasons)
            to_raise = all(r in _RAISE for r in reasons)
        if decrease is not None:
            if config.suspend_at_floor and job.duty_cycle <= config.duty_cycle_floor + 1e-9:
                duty = 0.0  # suspended: the floor was not enough
            else:
                duty = max(config.duty_cycle_floor, job.duty_cycle * config.duty_cycle_decrease_factor)
            reason = decrease
        elif to_ceiling:
            duty, reason = config.duty_cycle_ceiling, ThrottleReason.NO_GUARANTEED_NEIGHBOUR
        elif to_raise:
            duty = min(config.duty_cycle_ceiling, job.duty_cycle + config.duty_cycle_increase)
            reason = ThrottleReason.ROOM_AVAILABLE
        else:
            continue
        duty = round(duty, 3)
        if abs(duty - job.duty_cycle) > 1e-9:
            decisions.append(Throttle(job_id=job.id, duty_cycle=duty, reason=reason))
    if 0 < config.borrower_yield_duty < config.duty_cycle_ceiling:
        shared = [by_id[gpu_id] for gpu_id, signal in signals.items()
                  if signal is ThrottleReason.NO_GUARANTEED_NEIGHBOUR and gpu_id in by_id]
        if shared:
            decisions = _least_served_first(shared, decisions, utilisation, leaving, config)
    return decisions


def _least_served_first(gpus: list[GpuSlot], decisions: list[Throttle], utilisation: Mapping[int, float],
                        leaving: set[int], config: SchedulerConfig) -> list[Throttle]:
    """``decisions`` with the borrowers of each of ``gpus`` (no guaranteed resident) that share a
    saturated GPU yielding to the least served of them (module docstring)."""
    wanted: dict[int, tuple[float, ThrottleReason, float]] = {}  # job -> (duty, why, its duty now)
    ceiling, yielded = config.duty_cycle_ceiling, config.borrower_yield_duty
    for gpu in gpus:
        residents = [j for j in gpu.residents if j.id not in leaving]
        if len(residents) < 2 or gpu.live_load is None or any(len(j.gpu_ids) != 1 for j in residents):
            continue
        # The load with every borrower at the ceiling: each one's live use scaled up to it.
        at_ceiling = gpu.live_load + sum(
            utilisation.get(j.id, 0.0) * (ceiling / j.duty_cycle - 1) for j in residents if 0 < j.duty_cycle < ceiling)
        if at_ceiling < config.saturated_utilisation:
            continue  # (AIMD's "no guaranteed neighbour": all at the ceiling)
        # (stable for as long as they run: by the service before this run, then the latest start.
        # By the service this run as well, the yielding borrower caught up, the two swapped, and
        # the GPU was shared as before: 1.0354 against 1.0302 on seed 0)
        first = min(residents, key=lambda j: (j.attained_gpu_s, -j.started_at, j.id))
        for job in residents:
            if job is first:
                wanted[job.id] = (ceiling, ThrottleReason.NO_GUARANTEED_NEIGHBOUR, job.duty_cycle)
            else:
                wanted[job.id] = (yielded, ThrottleReason.GPU_SATURATED, job.duty_cycle)
    if not wanted:
        return decisions
    kept = [throttle for throttle in decisions if throttle.job_id not in wanted]
    for job_id, (duty, reason, now_duty) in wanted.items():
        if abs(duty - now_duty) > 1e-9:
            kept.append(Throttle(job_id=job_id, duty_cycle=round(duty, 3), reason=reason))
    return kept

