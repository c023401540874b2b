"""Driver-enforced GPU memory limits per cgroup: ``nvmlDeviceSetMemoryLimits_v1`` (nvidia-ml-py 13).

The driver caps what the processes of one cgroup may allocate on a GPU: past the hard limit an
allocation fails in that job (CUDA out of memory), not in its neighbour; under memory pressure the
driver keeps each cgroup's soft limit for it. The limits are in bytes and name the cgroup by its
full sysfs path; removing the cgroup clears them. MIG handles are not supported (a MIG instance
is fenced in hardware anyway).

Support is probed, never assumed: reading the limits of the agent's own cgroup on each GPU must
work. A binding without the functions, FUNCTION_NOT_FOUND (a driver without the entry point) and
NOT_SUPPORTED all mean "no". ``pynvml`` is imported lazily (the control plane and CI have no
driver); tests hand in a fake module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_FUNCTIONS = ("nvmlDeviceGetMemoryLimits_v1", "nvmlDeviceSetMemoryLimits_v1",
              "c_nvmlGetMemoryLimits_v1_t", "c_nvmlSetMemoryLimits_v1_t")


class MemoryLimitError(RuntimeError):
    """A limit could not be set; the message says on which GPU and why."""


def _reason(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # pynvml's __str__ calls into the library
        return f"{type(exc).__name__} {getattr(exc, 'value', '')}".strip()


class DriverMemoryLimits:
    """Sets and reads per-cgroup memory limits through NVML (``nvml``: the pynvml module)."""

    def __init__(self, nvml: Any):
        self._nvml = nvml
        self._open = True

    @classmethod
    def load(cls, nvml: Any = None) -> tuple[DriverMemoryLimits | None, str]:
        """NVML initialised with the limit functions, or None and why not."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return None, "pynvml (nvidia-ml-py) is not installed"
        missing = [name for name in _FUNCTIONS if not hasattr(nvml, name)]
        if missing:
            return None, f"this nvidia-ml-py has no {missing[0]} (nvidia-ml-py 13 or later has it)"
        try:
            nvml.nvmlInit()  # counted: the backend's own init and shutdown are unaffected
        except Exception as exc:
            return None, f"NVML did not initialise: {_reason(exc)}"
        return cls(nvml), ""

    def probe(self, uuid: str, cgroup: Path) -> tuple[bool, str]:
        """Whether the driver enforces limits on the GPU ``uuid``: reading ``cgroup``'s works."""
        nvml = self._nvml
        try:
            limits = nvml.c_nvmlGetMemoryLimits_v1_t()
            limits.nameSpace = str(cgroup).encode()
            nvml.nvmlDeviceGetMemoryLimits_v1(self._handle(uuid), limits)
        except Exception as exc:
            value = getattr(exc, "value", None)
            if value == getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", object()):
                return False, "the driver has no nvmlDeviceGetMemoryLimits_v1 (FUNCTION_NOT_FOUND)"
            if value == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                return False, "the driver does not support memory limits on this GPU (NOT_SUPPORTED)"
            return False, f"reading its memory limits failed: {_reason(exc)}"
        return True, ""

    def set(self, uuid: str, cgroup: Path, soft_mib: int, hard_mib: int) -> None:
        """Cap ``cgroup``'s memory on the GPU ``uuid``; MemoryLimitError when the driver refuses."""
        nvml = self._nvml
        if not 0 <= soft_mib <= hard_mib or hard_mib * MIB >= 2**64:
            # The driver takes bytes in 64 bits: a larger value would wrap to a small (or no) limit.
            raise MemoryLimitError(f"limits of {soft_mib}/{hard_mib} MiB are out of range")
        try:
            limits = nvml.c_nvmlSetMemoryLimits_v1_t()
            limits.nameSpace = str(cgroup).encode()
            limits.softLimit = soft_mib * MIB
            limits.hardLimit = hard_mib * MIB
            nvml.nvmlDeviceSetMemoryLimits_v1(self._handle(uuid), limits)
        except Exception as exc:
            raise MemoryLimitError(_reason(exc)) from None

    def used_mib(self, uuid: str, cgroup: Path) -> int | None:
        """What ``cgroup`` holds on the GPU now, as the driver counts it; None if unknown."""
        nvml = self._nvml
        try:
            limits = nvml.c_nvmlGetMemoryLimits_v1_t()
            limits.nameSpace = str(cgroup).encode()
            nvml.nvmlDeviceGetMemoryLimits_v1(self._handle(uuid), limits)
            return int(limits.currentUsed) // MIB
        except Exception:
            return None

    def _handle(self, uuid: str):
        return self._nvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
