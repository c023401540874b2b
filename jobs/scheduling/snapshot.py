"""Frozen inputs of the scheduler core: what the cluster has, what runs on it, and what is waiting.

The service layer (``jobs.services.snapshot_loader``) fills these from the database and Redis; the
trace-replay simulator fills them from its virtual cluster. Nothing here computes anything beyond
trivial derived properties, and nothing here may import Django, Redis or the clock.

Units: memory in MiB, compute in milli-GPUs (1000 = one whole GPU, as the Alibaba trace's
``gpu_milli``), utilisation as a fraction 0..1, times in seconds on the caller's clock, link
bandwidth in GB/s (10^9 bytes per second).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

WHOLE_GPU_MILLI = 1000


class JobClass(StrEnum):
    """AntMan's two classes: guaranteed work runs inside its tenant's quota as if alone;
    opportunistic work borrows spare capacity and yields (throttled or evicted) when asked."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


@dataclass(frozen=True, slots=True)
class GpuState:
    id: int
    index: int
    model: str
    memory_mib: int
    # Held by something the snapshot does not list in ``running`` (an allocation of unknown shape):
    # such a GPU is treated as fully used. Ignored when a listed running job sits on the GPU.
    busy: bool = False
    # How co-located jobs are fenced from each other (``agents.protocol.Isolation``): "mps",
    # "memory_limit" (the simulator's default: it kills the job that overflows), "mig" or
    # "unfenced" (``filters.isolation``).
    isolation: str = "memory_limit"
    # A MIG instance's GPU instance profile ("1g.10gb"); None for a whole GPU.
    mig_profile: str | None = None


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...]
    online: bool = True
    cordoned: bool = False
    rack: str = ""
    # Slowest GPU-to-GPU link inside the node: NVLink ~300, PCIe gen4 ~32.
    intra_node_gb_per_s: float = 32.0
    # Container runtimes the node's agent advertises (docker, podman, apptainer); empty: none, so
    # jobs with an image cannot run there.
    runtimes: frozenset[str] = frozenset()
    # CPU (milli-cores, 1000 = one core) and host memory (MiB) the node offers jobs; None: not
    # tracked, so never a constraint.
    cpu_milli: int | None = None
    host_memory_mb: int | None = None

    @property
    def schedulable(self) -> bool:
        return self.online and not self.cordoned

    def free_gpus(self, min_memory_mib: int = 0) -> list[GpuState]:
        return [gpu for gpu in self.gpus if not gpu.busy and gpu.memory_mib >= min_memory_mib]


@dataclass(frozen=True, slots=True)
class RecordedProfile:
    """What a job with the same ``profile_key`` did when it ran before (after Nimble).

    Used instead of the request for packing: requests are usually inflated.
    """

    peak_memory_mib: int
    mean_utilisation: float


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A pending job. Memory and compute are per GPU."""

    id: int
    tenant: str
    gpus: int
    submitted_at: float
    gpu_memory_mib: int | None = None
    priority: int = 0
    # Below 1000 asks for a fraction of one GPU (only with gpus == 1); such jobs may share a GPU.
    gpu_milli: int = WHOLE_GPU_MILLI
    # Allowed GPU models; empty means any.
    gpu_models: frozenset[str] = frozenset()
    # Never run as guaranteed, even inside the tenant's guarantee (cheap, preemptible work).
    opportunistic_only: bool = False
    # A guaranteed job that accepts another guaranteed job on its GPU.
    shareable: bool = False
    profile: RecordedProfile | None = None
    expected_runtime_s: float | None = None
    # 1 = single node only; None = as many as needed (fewest first).
    max_nodes: int | None = None
    # Bytes all-reduced per step (roughly the gradient size), for the topology cost model.
    allreduce_bytes: int | None = None
    # When this job's current gang reservation began; the service echoes ``Reservation.since``.
    reserved_since: float | None = None
    # GPU-seconds of service the job already had (runs before a preemption; a share of a GPU counts
    # its share). The LAS baseline and borrower turnover read it; the loader and the replay fill it.
    attained_gpu_s: float = 0.0
    # Job arrays: at most ``array_limit`` jobs of array ``array_id`` run at once (None: no cap).
    array_id: int | None = None
    array_limit: int | None = None
    # Dependencies that have not ended yet: (job id, "ok" = must succeed | "any" = must end).
    # Such a job is never placed; the service drops an entry once its job ends.
    waiting_for: tuple[tuple[int, str], ...] = ()
    # The job runs in a container image: only nodes with a container runtime can run it.
    needs_runtime: bool = False
    # CPU (milli-cores) and host memory (MiB) for the whole job; a gang spread over nodes takes
    # them in proportion to its GPUs on each (``filters.host_resources``). 0: asks for none.
    cpu_milli: int = 0
    host_memory_mb: int = 0
    # Who submitted it (any stable key; ``UserLimit.user``): per-user limits count by it.
    user: str = ""
    # Runs only on a MIG instance of this profile ("1g.10gb"); None: whole GPUs or fractions.
    mig_profile: str | None = None
    # May share an "unfenced" GPU (nothing enforces memory shares there) with other jobs.
    accepts_unfenced: bool = True

    @property
    def fractional(self) -> bool:
        return self.gpu_milli < WHOLE_GPU_MILLI

    @property
    def quota_milli(self) -> int:
        """What the job counts against its tenant's quota."""
        return self.gpus * self.gpu_milli


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs now (placed or running)."""

    id: int
    tenant: str
    job_class: JobClass
    gpu_ids: tuple[int, ...]
    started_at: float
    # Per GPU: the observed peak when known, else the request; None means the whole GPU.
    memory_mib: int | None = None
    gpu_milli: int = WHOLE_GPU_MILLI
    priority: int = 0
    expected_runtime_s: float | None = None
    duty_cycle: float = 1.0
    # Utilisation when it ran alone (from its profile): the yardstick for "slowed down". What it
    # uses now is a live reading (``LiveReadings.jobs``).
    solo_utilisation: float | None = None
    shareable: bool = False
    # Already told to stop (preempted, cancelling): its GPUs free up soon; never chosen again.
    preempting: bool = False
    # GPU-seconds of service in runs before this one; this run adds (now - started_at) x GPUs held
    # (``quota_milli`` / 1000: a share counts its share).
    attained_gpu_s: float = 0.0
    # Saves checkpoints and resumes from them: a preemption costs it little work, so reclaim
    # prefers it as a victim.
    checkpoints: bool = False
    # The job array it belongs to (counts against the array's ``array_limit``).
    array_id: int | None = None
    # What it asked for of its nodes' CPU (milli-cores) and host memory (MiB), whole job.
    cpu_milli: int = 0
    host_memory_mb: int = 0
    user: str = ""
    accepts_unfenced: bool = True

    @property
    def quota_milli(self) -> int:
        return len(self.gpu_ids) * self.gpu_milli

    @property
    def expected_end(self) -> float | None:
        if self.expected_runtime_s is None:
            return None
        return self.started_at + self.expected_runtime_s


@dataclass(frozen=True, slots=True)
class TenantQuota:
    name: str
    guaranteed_gpus: int
    max_gpus: int
    weight: float = 1.0
    # GPU-seconds of recent use with half-life decay, kept by the caller (see ``usage.decay_usage``).
    decayed_usage: float = 0.0

    @property
    def guaranteed_milli(self) -> int:
        return self.guaranteed_gpus * WHOLE_GPU_MILLI

    @property
    def ceiling_milli(self) -> int:
        # The guarantee is owed whatever the ceiling says; a ceiling below it means "no borrowing".
        return max(self.max_gpus, self.guaranteed_gpus) * WHOLE_GPU_MILLI


@dataclass(frozen=True, slots=True)
class UserLimit:
    """What a tenant lead allows one member inside the tenant: at most ``max_gpus`` GPUs held and
    ``max_running`` jobs running at once (None: no such limit). ``name`` is for reasons."""

    tenant: str
    user: str
    name: str = ""
    max_gpus: int | None = None
    max_running: int | None = None


@dataclass(frozen=True, slots=True)
class Promise:
    """GPUs a reclaim freed for a pending guaranteed job (``Decisions.promises``). The service
    keeps each with its job and hands it back in later snapshots until the job is placed: the job
    then goes onto those GPUs before anything else is placed, and while its victims are still
    stopping nobody else may take them. Without it the next cycle no longer knew whom each freed
    GPU was for: best fit could give one job's GPUs to another, and the first job reclaimed again
    (more borrowed work lost, one more cycle of waiting)."""

    job_id: int
    tenant: str
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LiveReadings:
    """What the node agents last measured, by GPU id and by job id; absent when not (yet) known.

    Kept apart from the GPUs and the jobs they describe: readings move with every sample, the
    inventory and the jobs' allocations seldom do, so a caller can hand the core the very
    ``NodeState`` and ``RunningJob`` objects of its last snapshot and only new readings (building
    10,000 running jobs and 8,000 GPUs again every cycle was most of the loop's snapshot)."""

    # A GPU's utilisation (0..1) and memory in use (MiB), whoever uses it.
    gpus: Mapping[int, float] = field(default_factory=dict)
    gpu_memory_used_mib: Mapping[int, int] = field(default_factory=dict)
    # A running job's mean utilisation over its GPUs, attributable to it (0..1).
    jobs: Mapping[int, float] = field(default_factory=dict)
    # A running job's service in this run: GPU-seconds counted at the speed it ran (its live
    # utilisation over its solo one; its duty cycle where either is unknown), as the caller
    # measured it over the cycles it saw. Absent: the time it has held its GPUs.
    served_gpu_s: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeState, ...]
    pending: tuple[JobRequest, ...]
    tenants: tuple[TenantQuota, ...] = field(default=())
    running: tuple[RunningJob, ...] = field(default=())
    user_limits: tuple[UserLimit, ...] = field(default=())
    # What earlier cycles' reclaims promised to jobs still pending (the service echoes them).
    promises: tuple[Promise, ...] = field(default=())
    readings: LiveReadings = field(default_factory=LiveReadings)
