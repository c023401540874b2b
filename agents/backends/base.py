"""The interface every GPU backend implements, and the plain values it takes and returns.

Interface only; no implementations here. Backends never touch Redis or signal processes: they
read (or, simulated, make up) GPU facts and say which jobs ran out of GPU memory; the agent acts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

from agents.protocol import GpuInfo, GpuLink, GpuSample, JobGpuSample


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (no driver, no library, no GPU)."""


@dataclass(frozen=True)
class JobProcesses:
    """What the agent knows about one running job, handed to :meth:`GpuBackend.sample`.

    The job's leader was started in its own session and process group, so ``pid`` is also the
    job's session id and process group id; every process the job spawns descends from it.
    """

    job_id: int
    pid: int
    gpu_indices: tuple[int, ...] = ()
    #: The environment the control plane set for the job (``LaunchJob.env``), not the agent's.
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_memory_limit_mib: int | None = None
    #: Share of wall time the job may run (throttling); 0.0 while it is suspended.
    duty_cycle: float = 1.0


@dataclass(frozen=True)
class OutOfMemory:
    """A job whose GPU ran out of memory; the agent kills it and reports ``JobExited(oom=True)``."""

    job_id: int
    gpu_index: int
    #: What the user reads, in the words a framework would use ("CUDA out of memory ...").
    error: str


@dataclass(frozen=True)
class BackendSample:
    """One interval's readings of the whole node."""

    gpus: list[GpuSample]
    #: Per job per GPU; a job whose memory on a GPU is unknown has no entry for that GPU.
    jobs: list[JobGpuSample] = field(default_factory=list)
    #: Memory held by processes that belong to no job of ours, per GPU index.
    unattributed_mib: dict[int, int] = field(default_factory=dict)
    out_of_memory: list[OutOfMemory] = field(default_factory=list)


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from a source of GPU facts.

    Implementations must be cheap to call every interval and must not raise on a single
    misbehaving GPU: report what can be read and degrade the rest to ``None`` ("unknown").

    Optional, and so not part of the protocol's check: ``native_isolation``, the isolation mode
    (``agents.protocol.Isolation``) the backend itself enforces on whole GPUs, which its inventory
    already reports (the simulated backend's ``"memory_limit"``). Absent or ``None``: the backend
    enforces nothing, and whole GPUs are ``"unfenced"`` until the agent's isolation layer says
    otherwise. MIG instances are ``"mig"`` on any backend.
    """

    #: Short name reported to the control plane in ``NodeRegistered.backend`` (<= 32 chars).
    name: str

    def inventory(self) -> list[GpuInfo]:
        """The node's GPUs, ordered by index (the index ``CUDA_VISIBLE_DEVICES`` uses)."""
        ...

    def topology(self) -> list[GpuLink]:
        """How each pair of the node's GPUs is connected (``a < b``); may be empty if unknown."""
        ...

    def sample(self, jobs: Mapping[int, JobProcesses]) -> BackendSample:
        """Read every GPU now; attribute per-process memory to ``jobs`` (keyed by job id).

        XID codes are those seen since the previous call. Must not block for long.
        """
        ...

    def close(self) -> None:
        """Release the library/driver handles. Idempotent."""
        ...
