"""The GPU search of one job in a cycle (``GpuSearch.find``): the placer's answer, bounded and
memoised, with a young gang's wait for one node.

Capacity only shrinks within a cycle, so a request shape that found nothing finds nothing again
(``Memo.failed``); a gang that fits on one node but finds none with room, while a spread placement
is possible, is told to wait (``OneNodeWait``) until ``gang_single_node_wait_s`` after its
submission. Every search counts against ``config.max_placement_searches``.
"""

from __future__ import annotations

from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.placement import Choice, OneNodeWait, Shape
from jobs.scheduling.reservation import may_backfill
from jobs.scheduling.snapshot import JobClass, JobRequest


class GpuSearch:
    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo):
        self.now, self.config = inputs.now, inputs.config
        self.placer, self.inventory = inputs.placer, inputs.inventory
        self.state, self.memo = state, memo

    def find(self, job: JobRequest, shape: Shape, job_class: JobClass) -> Choice | OneNodeWait | None:
        """GPUs for the job now, a young gang's wait for one node, or None (no room)."""
        state, memo = self.state, self.memo
        backfill = state.holder is not None and may_backfill(job, state.holder[2])
        tag = (job_class, backfill)
        if memo.failed.fails(tag, shape):
            return None
        held = state.reserved_nodes if backfill else []
        if self.young_gang(job, shape) and self.fits_one_node(shape):
            one_node = ("one node", job_class, backfill)
            if not memo.failed.fails(one_node, shape):
                state.searches += 1
                choice = self.placer.find(shape, job_class, held, spread=False)
                if choice is not None:
                    return choice
                memo.failed.record(one_node, shape)
            # Whether a spread is possible only changes with a placement: gangs of one shape share the answer.
            known = memo.now(state.version)
            if ("spread", shape, tag) not in known:
                state.searches += 1
                choice = self.placer.find(shape, job_class, held)
                known["spread", shape, tag] = None if choice is None else len(choice.slices)
            spread_nodes = known["spread", shape, tag]
            if spread_nodes is None:
                memo.failed.record(tag, shape)
                return None
            return OneNodeWait(spread_nodes)
        state.searches += 1
        choice = self.placer.find(shape, job_class, held)
        if choice is None:
            memo.failed.record(tag, shape)
        return choice

    def young_gang(self, job: JobRequest, shape: Shape) -> bool:
        """A gang still within its wait for one node (whether one could ever hold it aside)."""
        return (job.gpus > 1 and shape.max_nodes != 1
                and self.now - job.submitted_at < self.config.gang_single_node_wait_s)

    def fits_one_node(self, shape: Shape) -> bool:
        """Does some schedulable node have enough GPUs of one model for the whole gang?"""
        fits = self.memo.fits_one_node.get(shape)
        if fits is None:
            fits = self.memo.fits_one_node[shape] = any(
                widths and widths[0] >= shape.gpus
                for widths in map(self.inventory.node_widths, self.placer.pools_by_model(self.placer.pools_for(shape))))
        return fits
