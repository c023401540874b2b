"""The simulated clock: one number of seconds that only the simulation moves.

Patched (monkeypatching, never by editing product code) into every code path of the simulation
that reads the time: the ``time`` module as seen by the agent, control plane and fakeredis
modules (``time.time``/``time.monotonic``; fakeredis keys' TTLs, stream ids and ``TIME`` with
them) and ``django.utils.timezone.now``. Nothing here sleeps: a module that calls
``time.sleep`` under the simulation is a bug of the simulation, and raises.
"""

from __future__ import annotations

import sys
import time as real_time
from datetime import datetime, timezone as dt_timezone

# A fixed start (2025-06-15 12:00 UTC), so that a seed's trace reads the same every run.
EPOCH = 1_750_000_000.0
# What time.monotonic() reads at EPOCH (any positive number: only its differences count).
MONOTONIC_AT_EPOCH = 10_000.0
# Modules whose ``time`` global is swapped for the simulated one.
PATCHED_PACKAGES = ("agents.", "jobs.", "monitoring.", "fakeredis.", "tests.simulation.")


class SimClock:
    def __init__(self, start: float = EPOCH):
        self.now = start

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - EPOCH + MONOTONIC_AT_EPOCH

    def datetime(self) -> datetime:
        return datetime.fromtimestamp(self.now, tz=dt_timezone.utc)

    def advance_to(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"the simulated clock runs forward only ({when} < {self.now})")
        self.now = when


class SimulatedTimeModule:
    """Stands in for the ``time`` module: the clock's readings, the real module for the rest."""

    def __init__(self, clock: SimClock):
        self._clock = clock

    def time(self) -> float:
        return self._clock.time()

    def time_ns(self) -> int:
        return int(self._clock.time() * 1e9)

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def monotonic_ns(self) -> int:
        return int(self._clock.monotonic() * 1e9)

    def sleep(self, seconds: float) -> None:
        raise RuntimeError(f"time.sleep({seconds}) under the simulation: nothing may wait on the real clock")

    def __getattr__(self, name: str):
        return getattr(real_time, name)


def patch_time(clock: SimClock, monkeypatch) -> int:
    """Swap the simulated clock in with ``monkeypatch`` (pytest's, or a ``pytest.MonkeyPatch``);
    returns how many modules were patched. Every module that may run is imported first."""
    import fakeredis._helpers  # noqa: F401  (TTLs, stream ids)
    import fakeredis.commands_mixins.server_mixin  # noqa: F401  (TIME)
    from django.utils import timezone

    simulated = SimulatedTimeModule(clock)
    patched = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(PATCHED_PACKAGES):
            continue
        if getattr(module, "time", None) is real_time:
            monkeypatch.setattr(module, "time", simulated)
            patched += 1
    monkeypatch.setattr(timezone, "now", clock.datetime)
    return patched
