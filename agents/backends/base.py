"""The interface every GPU backend implements. Interface only; no implementations here."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agents.protocol import GpuInfo


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (no driver, no library, no GPU)."""


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from a source of GPU facts.

    Implementations must be cheap to call every interval and must not raise on a single
    misbehaving GPU: report what can be read and degrade the rest.
    """

    #: Short name reported to the control plane in ``NodeRegistered.backend`` (<= 32 chars).
    name: str

    def inventory(self) -> list[GpuInfo]:
        """The node's GPUs, ordered by index (the index ``CUDA_VISIBLE_DEVICES`` uses)."""
        ...

    # Metrics go here: a later issue adds ``sample() -> list[GpuSample]`` (utilisation, memory
    # used, temperature, power, XIDs, per-process memory) sent once per interval. Keep it on this
    # Protocol so the simulated and NVML backends stay interchangeable.

    def close(self) -> None:
        """Release the library/driver handles. Idempotent."""
        ...
