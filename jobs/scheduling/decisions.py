"""What the core decides; the service layer (``jobs.services.apply``) carries it out.

Decisions are data: the core has already simulated them on the snapshot (victims chosen, GPUs
picked, duty cycles computed), so the service only evicts, launches, throttles and stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import NamedTuple

from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.snapshot import JobClass, Promise


@dataclass(frozen=True, slots=True)
class NodeSlice:
    """The part of a placement on one node, with its torchrun ranks."""

    node: str
    gpu_ids: tuple[int, ...]
    gpu_indices: tuple[int, ...]
    node_rank: int = 0
    first_rank: int = 0  # global RANK of LOCAL_RANK 0 on this node


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """torchrun-style rendezvous for a multi-GPU job. MASTER_ADDR is the master node's name;
    the service maps it to an address if names do not resolve."""

    master_node: str
    master_port: int
    world_size: int
    nnodes: int

    def env(self, node_slice: NodeSlice, local_rank: int) -> dict[str, str]:
        """Environment for the process on ``node_slice`` with the given LOCAL_RANK."""
        return {
            "MASTER_ADDR": self.master_node,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(node_slice.first_rank + local_rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(len(node_slice.gpu_ids)),
            "NODE_RANK": str(node_slice.node_rank),
            "NNODES": str(self.nnodes),
        }


@dataclass(frozen=True, slots=True)
class Place:
    job_id: int
    slices: tuple[NodeSlice, ...]
    job_class: JobClass = JobClass.GUARANTEED
    # Per GPU; None when the job has its GPUs to itself. The agent enforces it on shared GPUs.
    memory_limit_mib: int | None = None
    gpu_milli: int = 1000
    duty_cycle: float = 1.0
    # Estimated seconds per all-reduce of the job's gradient on these GPUs (0 for one GPU).
    allreduce_s: float = 0.0
    rendezvous: Rendezvous | None = None
    # For the job's timeline: where it went and why there (one node, or spread after a wait).
    note: str = ""

    @property
    def node(self) -> str:
        """The only node, or the master node of a multi-node placement."""
        return self.slices[0].node

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.slices)

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return tuple(g for s in self.slices for g in s.gpu_ids)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """Indices on the single node; a multi-node placement must be read per slice."""
        if len(self.slices) != 1:
            raise ValueError(f"job {self.job_id} spans {len(self.slices)} nodes; read place.slices")
        return self.slices[0].gpu_indices


class PreemptReason(StrEnum):
    RECLAIM_FOR_GUARANTEE = "reclaim_for_guarantee"
    MEMORY_PRESSURE = "memory_pressure"
    LEAST_ATTAINED = "least_attained"  # a fresher borrower gets the GPUs (``turnover``)
    MOVE_TO_EMPTY_GPU = "move_to_empty_gpu"  # a crowded borrower restarts alone (``move_crowded_borrowers``)


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop an opportunistic job and requeue it. Never issued for a guaranteed job."""

    job_id: int
    reason: PreemptReason
    message: str
    for_job_id: int | None = None
    requeue: bool = True


class ThrottleReason(StrEnum):
    NEIGHBOUR_SLOWED = "guaranteed_neighbour_slowed"
    GPU_SATURATED = "gpu_saturated"
    GUARANTEED_JOB_PLACED = "guaranteed_job_placed"
    ROOM_AVAILABLE = "room_available"
    # No guaranteed job (staying) shares any of its GPUs: nothing to protect, full speed at once.
    NO_GUARANTEED_NEIGHBOUR = "no_guaranteed_neighbour"


@dataclass(frozen=True, slots=True)
class Throttle:
    """Set an opportunistic job's duty cycle (fraction of time it may run); 0 suspends it (its
    processes are stopped and keep their GPU memory; compute is freed)."""

    job_id: int
    duty_cycle: float
    reason: ThrottleReason


class Pending(NamedTuple):
    """Why a job waits, and when it may start. A named tuple, not a dataclass: a cycle builds one
    per waiting job (50,000 at scale), and a tuple is built in half the time of even a slotted
    frozen dataclass (read-only all the same)."""

    job_id: int
    reason: PendingReason
    # When it could start, on the clock ``decide`` was given (the epoch, in production), where
    # running jobs' expected ends allow a guess. A time already past: any moment (what it waits
    # for is overdue). A time, not seconds from now: a guess that holds is the same from one cycle
    # to the next, so a steady queue is told the very verdicts it was told (``QueueColumns.told``).
    eta_at: float | None = None

    def as_dict(self) -> dict:
        return {**self.reason.as_dict(), "eta_at": self.eta_at}

    def eta_s(self, now: float) -> float | None:
        """Seconds from ``now`` until it could start (0: any moment), where there is a guess."""
        return None if self.eta_at is None else max(0.0, self.eta_at - now)


# ``new_pending((job_id, reason, eta_at))``: the same Pending, built without the Python-level
# ``__new__`` a named tuple has (all three fields given; for the loops that see every waiting job).
new_pending = partial(tuple.__new__, Pending)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A blocked gang holds these nodes; the service stores ``since`` as the job's reserved_since."""

    job_id: int
    nodes: tuple[str, ...]
    since: float
    until: float
    # Seconds from now until the held nodes should have room, when known.
    eta_s: float | None = None


@dataclass(frozen=True, slots=True)
class Decisions:
    placements: tuple[Place, ...] = field(default=())
    pending: tuple[Pending, ...] = field(default=())
    preemptions: tuple[Preempt, ...] = field(default=())
    throttles: tuple[Throttle, ...] = field(default=())
    reservations: tuple[Reservation, ...] = field(default=())
    # GPUs promised to reclaiming jobs, new or still held: the service keeps them with their jobs
    # and puts them in the next snapshot (``ClusterSnapshot.promises``), replacing the old ones.
    promises: tuple[Promise, ...] = field(default=())
    # Where verdicts of ``pending`` were told in the cycle before, as runs: (index of the run's
    # first verdict in ``pending``, the index in the verdicts of the cycle that last told each;
    # -1: none); a verdict in no run was told at its own index, if at all. A hint, not a decision
    # (so not compared): a verdict that is the very object found there was told then, which lets
    # the service find what changed without a look at each job.
    told_at: tuple[tuple[int, list[int]], ...] = field(default=(), compare=False)
