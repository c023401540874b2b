"""What one cycle leaves for the next (``Carry``), so that a steady queue is not sorted and
sized again every cycle.

Between two cycles most of 50,000 pending jobs are the very same requests (the snapshot loader
hands back the same ``JobRequest`` objects for rows that did not change), on the same inventory,
under the same config. What ``decide()`` derives from those alone is kept here:

* each request's ``Shape`` and the reason it can never run on this inventory (or None), by
  request key: valid while the config and the inventory (``inventory_key``) stay the same (shapes
  are compared by identity, so a carried queue holds the very objects this table gives out);
* each tenant's ordered queue and the reasons its jobs got before any pass (dependencies,
  over the ceiling, impossible on this inventory): valid while the tenant's pending jobs, its
  ceiling, the config and the inventory stay the same.

Anything else a cycle computes depends on what is free or held now and is never carried. A carry
only ever answers with what a cycle without one would have computed: ``decide(s, now, config,
carry)`` equals ``decide(s, now, config)`` whatever history the carry saw
(tests/scheduling/test_carry.py checks that on random histories). Pure data, like the rest of
the core: the caller keeps one per process and hands it to each cycle in turn (not to two cycles
at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.scheduling.capacity import Capacity
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Pending
from jobs.scheduling.placement import Shape
from jobs.scheduling.snapshot import JobRequest


UNLIMITED_GPUS = 10**9
# Request keys come and go with the jobs (a recorded profile's peak memory alone takes many
# values): past this many remembered shapes, start again rather than grow for as long as the
# scheduler process lives. (Carried queues keep their own shapes; only new keys are recomputed.)
MAX_SHAPES = 200_000


class Outcome:
    """The borrowing pass's memo key for one tenant's requests of one shape and class
    (opportunistic only or not). Interned per queue and hashed by identity: most of 50,000 jobs
    are settled by a lookup under it, and a tuple key would be built and hashed per job."""

    __slots__ = ("tenant", "shape", "opportunistic_only")

    def __init__(self, tenant: str, shape: Shape, opportunistic_only: bool):
        self.tenant, self.shape, self.opportunistic_only = tenant, shape, opportunistic_only

    def __repr__(self) -> str:
        return f"Outcome({self.tenant!r}, {self.shape!r}, opportunistic_only={self.opportunistic_only})"


# A queue entry: the job, its shape, the milli-GPUs it needs, its ``Outcome`` and whether its
# outcome also depends on the hold or the clock (it may backfill, or it may wait for one node).
Entry = tuple[JobRequest, Shape, int, Outcome, bool]


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """One tenant's pending jobs (in the snapshot's order) and what the queue step made of them."""

    jobs: list[JobRequest]
    ceiling_milli: int
    queue: list[Entry]  # ordered: priority (high first), submit time, id
    waits: list[Pending]  # told before any pass, in queue order
    smallest_guaranteed_ask: int  # milli-GPUs of the smallest job in ``queue`` that may run guaranteed

    def without_departed(self, jobs: list[JobRequest]) -> TenantQueue | None:
        """The same queue for ``jobs``, if they are these jobs less some that left (placed,
        cancelled): what a cycle's placements do to most queues. None if any job is new or changed."""
        if len(jobs) >= len(self.jobs):
            return None
        kept = {job.id: job for job in self.jobs}
        if len(kept) != len(self.jobs) or not all(kept.get(job.id) is job for job in jobs):
            return None
        staying = {job.id for job in jobs}
        if len(staying) != len(jobs):
            return None  # (one id twice: not the loader's doing; rebuilt as a fresh cycle would)
        queue = [entry for entry in self.queue if entry[0].id in staying]
        smallest = min((need for job, _, need, _, _ in queue if not job.opportunistic_only), default=UNLIMITED_GPUS)
        return TenantQueue(jobs, self.ceiling_milli, queue, [wait for wait in self.waits if wait.job_id in staying],
                           smallest)


def inventory_key(capacity: Capacity) -> tuple:
    """Everything of the inventory that ``explain.InventoryCheck`` reads: the pools (model, memory,
    link, runtime, MIG profile) and, per node, its name, whether it takes work or is cordoned, its
    CPU and host memory, and the pool of each GPU. Live readings and residents are left out:
    they change every cycle and no inventory reason depends on them."""
    return (tuple(capacity.pools),
            tuple((node.name, node.schedulable, node.cordoned, node.has_runtime, node.cpu_total, node.host_total_mb,
                   tuple([gpu.pool for gpu in node.gpus])) for node in capacity.nodes))


class Carry:
    def __init__(self) -> None:
        self._config: SchedulerConfig | None = None
        self._inventory: tuple | None = None
        self.shapes: dict[tuple, tuple] = {}  # request key -> (Shape, inventory reason or None)
        self.queues: dict[str, TenantQueue] = {}

    def begin(self, config: SchedulerConfig, capacity: Capacity) -> None:
        """Start a cycle: forget everything if the config or the inventory changed."""
        inventory = inventory_key(capacity)
        if config != self._config or inventory != self._inventory:
            self._config, self._inventory = config, inventory
            self.shapes, self.queues = {}, {}
        elif len(self.shapes) > MAX_SHAPES:
            # (the queues go too: a cycle interns one Shape per request key, and memos and the
            # search budget count by Shape identity, so a carried queue must hold the shapes
            # this table hands out)
            self.shapes, self.queues = {}, {}
