"""A cycle's working copy is freed as soon as ``decide`` returns. Objects left in reference cycles
wait for the garbage collector instead, and its next pass walks every object the cycle allocated:
at 8,192 GPUs that was some 80 ms of collector time per scheduling cycle."""

from __future__ import annotations

import gc

from jobs.scheduling import SchedulerConfig, decide
from jobs.scheduling.carry import Carry
from tests.scheduling.builders import cluster, job, node, running, tenant


def test_a_cycle_leaves_no_garbage_in_reference_cycles():
    snapshot = cluster(
        node("a", gpus=4, util={0: 0.9}), node("b", gpus=4), node("c", gpus=2, busy=1),
        tenants=[tenant("nlp", guaranteed=4), tenant("cv", guaranteed=2, max_gpus=8)],
        running=[running(7, on="a", gpus=[0, 1], tenant="cv", opportunistic=True),
                 running(8, on="b", gpus=[0], tenant="nlp"), running(9, on="a", gpus=[2], tenant="nlp")],
        pending=[job(1, tenant="nlp", gpus=4), job(2, tenant="cv", gpus=8), job(3, tenant="cv", milli=500),
                 job(4, tenant="nlp", gpus=2, mem_gib=20), job(5, tenant="cv", gpus=3)])
    carry = Carry()
    decide(snapshot, 100.0, SchedulerConfig(), carry)  # (the carry's own tables are built once)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        decisions = decide(snapshot, 101.0, SchedulerConfig(), carry)
        fresh = decide(snapshot, 101.0, SchedulerConfig())
        assert decisions.placements and decisions.pending  # (a cycle that did something)
        assert decisions == fresh
        del decisions, fresh
        assert gc.collect() == 0
    finally:
        if was_enabled:
            gc.enable()
