"""The node's local coordinator (AntMan's): keeps a guaranteed job's GPU for it without waiting for
the control plane.

The control plane decides who may borrow and within what bounds: each borrower (a job launched as
``opportunistic``) has a *ceiling*, the duty cycle the control plane last set (its launch's, then
each ``SetDutyCycle``), and a *floor* (``LaunchJob.duty_cycle_floor``). Between the two the node
moves the borrower itself, from what it reads every sample:

* **cut** (multiply by ``decrease_factor``) a borrower on a GPU whose utilisation is at or above
  ``saturated`` while a guaranteed job runs there: the first saturated reading cuts at once; a
  GPU still saturated one ``settle_s`` later (enough for the cut to show in a reading: the duty
  cycler's period) cuts again, until the floor;
* **raise** (add ``increase``, once per ``settle_s``) while every GPU of the borrower that holds a
  guaranteed job reads below ``room``, up to the ceiling; between ``room`` and ``saturated`` it
  holds (a dead band, or the borrower would saw up and down across the threshold);
* **back to the ceiling** at once when none of its GPUs holds a guaranteed job any more;
* **hold** when a GPU gives no reading.

A borrower on several GPUs is cut if any of them says so and raised only if all do, as the
control plane's AIMD (``jobs.scheduling.duty_cycles``) does. Guaranteed jobs, jobs whose launch
named no class, and suspended jobs are never moved here; a suspended guaranteed job (it computes
nothing) is no neighbour to protect. This module only decides: readings and the time in, new duty
cycles out. The agent applies them through the runner's duty cycler and reports them in its
samples (``NodeSample.duty_cycles``).

What must not live here: I/O of any kind, signals, Redis, the protocol's parsing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

GUARANTEED = "guaranteed"
OPPORTUNISTIC = "opportunistic"

# GPU utilisation (0..1) at or above which a GPU with a guaranteed job counts as saturated, and
# below which its borrowers may speed up again. Below the control plane's (0.95 and 0.85): the node
# acts on each one-second reading, so it may act on a lower, earlier sign.
SATURATED = 0.9
ROOM = 0.8
DECREASE_FACTOR = 0.5
INCREASE = 0.1
# A move shows in a reading only after a whole duty cycler period (1 s) has run under it. Readings
# come about an interval apart, never exactly: one that comes up to 10% early counts as settled.
SETTLE_S = 1.0
SETTLE_SLACK = 0.9
_EPSILON = 1e-9

# Why a borrower moved (``Change.reason``).
SATURATED_BESIDE_GUARANTEED = "gpu_saturated"
ROOM_AVAILABLE = "room_available"
NO_GUARANTEED_NEIGHBOUR = "no_guaranteed_neighbour"
CEILING_SET = "ceiling_set"


@dataclass(frozen=True)
class Resident:
    """A job the node runs, as the coordinator needs it (from its ``LaunchJob``)."""

    job_id: int
    job_class: str | None  # GUARANTEED, OPPORTUNISTIC, or None: not said (left to the control plane)
    gpu_indices: tuple[int, ...]
    floor: float = 0.1
    ceiling: float = 1.0  # the duty cycle the control plane launched it at


@dataclass(frozen=True)
class Change:
    """A borrower's new duty cycle, and why: ``gpu_index`` and ``utilisation`` are the reading
    that decided it (None for a move that no reading decided)."""

    job_id: int
    before: float
    duty_cycle: float
    reason: str
    gpu_index: int | None = None
    utilisation: float | None = None
    guaranteed: tuple[int, ...] = ()  # the guaranteed jobs on that GPU


@dataclass
class _Borrower:
    resident: Resident
    ceiling: float
    duty_cycle: float
    moved_at: float = -math.inf  # when the node last moved it (the caller's clock)


class LocalCoordinator:
    """The duty cycles of one node's borrowers, between their floors and ceilings. Not thread-safe:
    the agent calls it from its loop only."""

    def __init__(self, *, saturated: float = SATURATED, room: float = ROOM, decrease_factor: float = DECREASE_FACTOR,
                 increase: float = INCREASE, settle_s: float = SETTLE_S):
        if not 0 < room <= saturated <= 1:
            raise ValueError("need 0 < room <= saturated <= 1")
        if not 0 < decrease_factor < 1 or not 0 < increase <= 1 or settle_s < 0:
            raise ValueError("need 0 < decrease_factor < 1, 0 < increase <= 1 and settle_s >= 0")
        self.saturated, self.room = saturated, room
        self.decrease_factor, self.increase, self.settle_s = decrease_factor, increase, settle_s
        self._residents: dict[int, Resident] = {}
        self._borrowers: dict[int, _Borrower] = {}

    # ------------------------------------------------------------------ membership

    def admit(self, resident: Resident, duty_cycle: float | None = None) -> None:
        """A job launched (or adopted) here; ``duty_cycle``: what it runs at now (default: its
        ceiling). Admitting a job again changes nothing: its launch is the same."""
        if resident.job_id in self._residents:
            return
        self._residents[resident.job_id] = resident
        if resident.job_class == OPPORTUNISTIC:
            ceiling = _bounded(resident.ceiling)
            now = ceiling if duty_cycle is None else min(ceiling, _bounded(duty_cycle))
            self._borrowers[resident.job_id] = _Borrower(resident, ceiling, now)

    def forget(self, job_id: int) -> None:
        self._residents.pop(job_id, None)
        self._borrowers.pop(job_id, None)

    def known(self) -> set[int]:
        return set(self._residents)

    def is_borrower(self, job_id: int) -> bool:
        return job_id in self._borrowers

    def ceiling(self, job_id: int) -> float | None:
        borrower = self._borrowers.get(job_id)
        return None if borrower is None else borrower.ceiling

    def duty_cycle(self, job_id: int) -> float | None:
        """The duty cycle the coordinator runs a borrower at; None for any other job."""
        borrower = self._borrowers.get(job_id)
        return None if borrower is None else borrower.duty_cycle

    # ------------------------------------------------------------------ the control plane's bound

    def set_ceiling(self, job_id: int, ceiling: float) -> float | None:
        """The control plane set the job's duty cycle (``SetDutyCycle``): for a borrower that is its
        new ceiling. Returns the duty cycle to run it at now (the ceiling itself when no guaranteed
        job shares its GPUs; else the lower of the ceiling and where the node holds it, which the
        node raises again as room allows), or None when the job is no borrower of this
        coordinator's (apply the command as sent)."""
        borrower = self._borrowers.get(job_id)
        if borrower is None:
            return None
        borrower.ceiling = _bounded(ceiling)
        if self._guaranteed_neighbours(borrower.resident, ()):
            borrower.duty_cycle = min(borrower.duty_cycle, borrower.ceiling)
        else:
            borrower.duty_cycle = borrower.ceiling
        return borrower.duty_cycle

    # ------------------------------------------------------------------ one reading

    def step(self, now: float, utilisation: Mapping[int, float | None],
             suspended: Collection[int] = ()) -> list[Change]:
        """Decide from one reading. ``now``: the caller's monotonic clock (seconds);
        ``utilisation``: GPU index -> utilisation 0..1 (None or missing: unknown); ``suspended``:
        jobs stopped until resumed (left as they are; a suspended guaranteed job protects nothing).
        Returns the borrowers whose duty cycle changed, with their new value (already recorded)."""
        changes = []
        for job_id, borrower in self._borrowers.items():
            if job_id in suspended:
                continue
            change = self._decide(borrower, now, utilisation, suspended)
            if change is not None:
                borrower.duty_cycle, borrower.moved_at = change.duty_cycle, now
                changes.append(change)
        return changes

    def _decide(self, borrower: _Borrower, now: float, utilisation: Mapping[int, float | None],
                suspended: Collection[int]) -> Change | None:
        job, duty, ceiling = borrower.resident, borrower.duty_cycle, borrower.ceiling
        floor = min(job.floor, ceiling)
        settled = now - borrower.moved_at >= self.settle_s * SETTLE_SLACK
        cut_on = None  # (gpu, reading, guaranteed ids) of the first saturated GPU
        all_free, all_room = True, True
        room_on = None
        for gpu in dict.fromkeys(job.gpu_indices):
            guaranteed = self._guaranteed_on(gpu, suspended)
            if not guaranteed:
                continue
            all_free = False
            reading = utilisation.get(gpu)
            if reading is None or not math.isfinite(reading):
                all_room = False
                continue
            if reading >= self.saturated - _EPSILON:
                cut_on = cut_on or (gpu, reading, guaranteed)
                all_room = False
            elif reading < self.room:
                room_on = room_on or (gpu, reading, guaranteed)
            else:
                all_room = False
        if cut_on is not None:
            target = max(floor, round(duty * self.decrease_factor, 3))
            if not settled or target > duty - _EPSILON:
                return None  # (a cut still showing, or at the floor already)
            gpu, reading, guaranteed = cut_on
            return Change(job.job_id, duty, target, SATURATED_BESIDE_GUARANTEED, gpu, reading, guaranteed)
        if all_free:
            if abs(duty - ceiling) < _EPSILON:
                return None
            return Change(job.job_id, duty, ceiling, NO_GUARANTEED_NEIGHBOUR)
        if all_room and duty < ceiling - _EPSILON and settled:
            gpu, reading, guaranteed = room_on
            return Change(job.job_id, duty, round(min(ceiling, duty + self.increase), 3), ROOM_AVAILABLE, gpu,
                          reading, guaranteed)
        return None

    def _guaranteed_on(self, gpu: int, suspended: Collection[int]) -> tuple[int, ...]:
        return tuple(sorted(job_id for job_id, resident in self._residents.items()
                            if resident.job_class == GUARANTEED and gpu in resident.gpu_indices
                            and job_id not in suspended))

    def _guaranteed_neighbours(self, job: Resident, suspended: Collection[int]) -> bool:
        return any(self._guaranteed_on(gpu, suspended) for gpu in job.gpu_indices)


def _bounded(duty_cycle: float) -> float:
    return min(1.0, max(0.0, duty_cycle))
