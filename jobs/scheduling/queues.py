"""The tenant queues of one cycle (``TenantQueues``): every pending job grouped by tenant, in
queue order (priority, then submit time, then id), each made an entry (job, shape, milli-GPUs it
needs, its borrowing memo key, whether its answer is its own) or told at once why it waits (it can
never run on this inventory, it asks more than its tenant may ever hold, it waits for a job it
depends on). Such jobs take no part in the passes: no reservation, no place in anyone's way.

Built from ``carry.Carry`` where the tenant's jobs and ceiling did not change: the same queue as
last cycle, not sorted and sized again.
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter

from jobs.scheduling import reasons
from jobs.scheduling.carry import ALONE, UNLIMITED_GPUS, Entry, Outcome, QueueColumns, QueueReadings, TenantQueue
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import Pending, new_pending
from jobs.scheduling.explain import invalid_request
from jobs.scheduling.placement import Shape, shape_of
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobRequest

_by_id, _by_submitted_at, _by_priority = attrgetter("id"), attrgetter("submitted_at"), attrgetter("priority")


def request_key(job: JobRequest) -> tuple:
    """Everything about a request that placement looks at (equal keys share one Shape). Plain
    values only: comparing dataclasses on every dict hit would cost more than the rest."""
    profile = job.profile
    return (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
            job.allreduce_bytes, profile and profile.peak_memory_mib, profile and profile.mean_utilisation,
            job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile, job.accepts_unfenced)


def queue_key(job: JobRequest) -> tuple:
    """Equal for two jobs of one tenant when ``TenantQueues.entries`` makes the same entry of both,
    bar the job itself, its dependencies and its expected runtime: the request key's fields (the
    recorded profile's two apart, after the rest) and whether the job may run guaranteed.
    (``entries`` spells it out: it sees every pending job.)"""
    key = (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
           job.allreduce_bytes, job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile,
           job.accepts_unfenced, job.opportunistic_only)
    profile = job.profile
    return key if profile is None else (key, profile.peak_memory_mib, profile.mean_utilisation)


class TenantQueues:
    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo):
        self.inputs, self.now, self.config, self.carry = inputs, inputs.now, inputs.config, inputs.carry
        self.state, self.memo = state, memo

    def build(self) -> dict[str, list[Entry]]:
        """Each tenant's entries, tenants by name; the jobs told at once are in ``state.pending``."""
        by_tenant = self.carry.tenants_of(self.inputs.snapshot.pending)
        queues: dict[str, list[Entry]] = {}
        kept, carried = self.carry.queues, {}
        for tenant in sorted(by_tenant):
            jobs, ceiling = by_tenant[tenant], self.inputs.quota(tenant).ceiling_milli
            # The same jobs (the very same objects, mostly: a list compare at C speed) under the
            # same ceiling make the same queue as last cycle.
            found = kept.get(tenant)
            if found is None or found.ceiling_milli != ceiling:
                found = self._tenant_queue(tenant, jobs, ceiling)
            elif found.jobs is not jobs and found.jobs != jobs:
                found = (found.updated(jobs, partial(self.entries, tenant, ceiling))
                         or self._tenant_queue(tenant, jobs, ceiling))
            carried[tenant] = found
            queues[tenant] = found.queue
            found.tell_waits(self.state.pending, self.state.told_at)
            self.state.smallest_guaranteed_ask[tenant] = found.smallest_guaranteed_ask
        self.carry.queues = carried
        return queues

    def _shape_and_reason(self, job: JobRequest) -> tuple[Shape, PendingReason | None]:
        """A request's shape and, if it cannot run on this inventory at all, why (cached together:
        50,000 jobs come in a few thousand shapes)."""
        key = request_key(job)
        found = self.carry.shapes.get(key)
        if found is None:
            shape, invalid = shape_of(job, self.config), invalid_request(job)
            found = self.carry.shapes[key] = (shape, invalid or self.inputs.inventory.reason(shape),
                                              invalid is not None)
        return found[0], found[1]

    def _tenant_queue(self, tenant: str, jobs: list[JobRequest], ceiling: int) -> TenantQueue:
        ordered = list(jobs)
        # Priority (high first), then submit time, then id: three C-level stable sorts on one
        # attribute each, the last key first (an int or float key compares in a few instructions,
        # a tuple key through generic rich comparisons, which cost more than the extra passes).
        ordered.sort(key=_by_id)
        ordered.sort(key=_by_submitted_at)
        ordered.sort(key=_by_priority, reverse=True)
        outcomes: dict = {}
        queue, waits, smallest, read = self.entries(tenant, ceiling, ordered, outcomes)
        made = TenantQueue(jobs, ceiling, queue, waits, smallest, outcomes)
        if made.shares_keys:  # (else the borrowing pass settles it one by one: no columns)
            made.columns = QueueColumns(queue, read)
            if read.keys is not None:  # (this cycle's first borrowing visit needs no keys made)
                made.columns.seed_keys(read.keys, read.young_gangs)
        return made

    def entries(self, tenant: str, ceiling: int, ordered: list[JobRequest],
                outcomes: dict) -> tuple[list[Entry], list[Pending], int, QueueReadings]:
        """The queue entries of ``ordered`` (jobs in queue order), the waits told before any pass,
        the smallest ask that may run guaranteed, and what ``QueueColumns`` reads of the entries'
        jobs (read here, with each job at hand), with each entry's memo key in a borrowing pass
        at this cycle's clock without a hold (``QueueColumns.keys``; None where a gang's submit
        time is not a number). ``outcomes``: the tenant queue's interned ``Outcome`` per (shape,
        opportunistic only), added to as needed."""
        queue: list[Entry] = []
        waits: list[Pending] = []
        smallest = UNLIMITED_GPUS
        # This loop sees every pending job, and a tenant's 500 jobs come in a few dozen requests:
        # what a job gets is worked out once per ``queue_key`` and looked up after.
        kinds: dict[tuple, tuple] = {}
        append, append_wait = queue.append, waits.append
        ids, runtimes, arrays, gangs, gang_submitted, timed, keys = [], [], [], [], [], [], []
        append_id, append_runtime, append_gang, append_submitted, append_timed, append_key = (
            ids.append, runtimes.append, gangs.append, gang_submitted.append, timed.append, keys.append)
        now, one_node_wait, young, timeless = self.now, self.config.gang_single_node_wait_s, 0, False
        reason_of = self.memo.reason
        for job in ordered:
            # (``queue_key`` inlined; attributes read in bytecode, not by an attrgetter: the
            # interpreter's specialised slot reads cost a fraction of an attrgetter's generic lookup)
            key = (job.gpus, job.gpu_milli, job.gpu_memory_mib, job.gpu_models, job.max_nodes, job.shareable,
                   job.allreduce_bytes, job.needs_runtime, job.cpu_milli, job.host_memory_mb, job.mig_profile,
                   job.accepts_unfenced, job.opportunistic_only)
            profile = job.profile
            if profile is not None:
                key = (key, profile.peak_memory_mib, profile.mean_utilisation)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = self._entry_kind(tenant, ceiling, job, outcomes)
            shape, reason, need, outcome, spread_gang, ask = kind
            if reason is not None:
                append_wait(new_pending((job.id, reason, None)))
            elif job.waiting_for:
                append_wait(new_pending((job.id, reason_of(reasons.waiting_for_dependency, job.waiting_for), None)))
            else:
                runtime = job.expected_runtime_s
                append((job, shape, need, outcome, spread_gang or runtime is not None))
                if runtime is not None and runtime == runtime:  # (NaN: never backfills, see QueueColumns)
                    append_timed(len(ids))
                # Its memo key as ``QueueColumns.keys`` makes it with no hold: a gang young enough
                # to wait for one node apart (``GpuSearch.young_gang``'s test), an array job alone.
                memo_key = outcome
                if spread_gang:
                    submitted = job.submitted_at
                    append_gang(len(ids))
                    append_submitted(submitted)
                    if now - submitted < one_node_wait:
                        memo_key = outcome.young_key or outcome.key(False, True)
                        young += 1
                    elif not now - submitted >= one_node_wait:
                        timeless = True  # (not a number: the columns' sorted bisection decides)
                if job.array_limit is not None:
                    arrays.append(len(ids))
                    memo_key = ALONE
                append_id(job.id)
                append_runtime(runtime)
                append_key(memo_key)
                if ask < smallest:
                    smallest = ask
        return queue, waits, smallest, QueueReadings(ids, runtimes, arrays, gang_submitted,
                                                     None if timeless else keys, young, gangs, timed)

    def _entry_kind(self, tenant: str, ceiling: int, job: JobRequest, outcomes: dict) -> tuple:
        """What ``entries`` makes of every job of ``tenant`` with ``job``'s ``queue_key``:
        (shape, the reason it waits before any pass or None, milli-GPUs it needs, its Outcome,
        whether it is a gang that may spread, the ask it adds to the smallest guaranteed one)."""
        need = job.gpus * job.gpu_milli
        if need > ceiling and job.gpu_milli <= WHOLE_GPU_MILLI:  # more than the tenant may ever hold: say so first
            over = self.memo.reason(reasons.over_max_gpus, tenant, ceiling, need)
            return None, over, need, None, False, UNLIMITED_GPUS
        shape, reason = self._shape_and_reason(job)
        if reason is not None:
            return shape, reason, need, None, False, UNLIMITED_GPUS
        opportunistic_only = job.opportunistic_only
        outcome = outcomes.get((shape, opportunistic_only))
        if outcome is None:
            outcome = outcomes[shape, opportunistic_only] = Outcome(tenant, shape, opportunistic_only)
        return (shape, None, need, outcome, outcome.spread_gang,
                UNLIMITED_GPUS if opportunistic_only else need)
