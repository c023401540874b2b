"""What bench/scheduling_loop.py counts as a steady cycle: one where nothing changed since the
cycle before (that cycle placed and preempted nothing, and no job started, ended or arrived in
between). The cycle right after placements reads them back and must stay out of the steady median."""

from __future__ import annotations

import pytest

from bench.scheduling_loop import steady_next
from jobs.services.scheduling_loop import CycleResult


@pytest.mark.parametrize(
    ("previous", "changed_since", "steady"),
    [
        (CycleResult(ran=True), 0, True),
        (CycleResult(ran=True, throttled=40), 0, True),  # (AIMD's moves with live samples, every cycle)
        (CycleResult(ran=True, placed=2703), 0, False),  # right after placements
        (CycleResult(ran=True, placed=0), 2703, False),  # the agents started the jobs placed before
        (CycleResult(ran=True, preempted=1), 0, False),
        (CycleResult(ran=True), 8, False),  # jobs ended since
        (None, 0, False),  # the first cycle of a process
    ],
)
def test_a_cycle_is_steady_only_when_nothing_changed_since_the_one_before(previous, changed_since, steady):
    assert steady_next(previous, changed_since) is steady
