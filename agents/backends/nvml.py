"""The real GPU backend: NVIDIA's management library through ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported inside functions so this module imports on machines without it (the
control plane, CI, laptops); only constructing :class:`NvmlBackend` needs the library.
A GPU whose name or UUID cannot be read is still reported, with a placeholder; one whose memory
cannot be read is left out of the inventory, because the scheduler would pack against a made-up
number.
"""

from __future__ import annotations

import logging

from agents.backends.base import BackendUnavailable
from agents.protocol import GpuInfo

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def _text(value) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def available() -> bool:
    """True when pynvml imports, NVML initialises and at least one GPU is visible."""
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError, or an OSError when libnvidia-ml.so is missing
        return False
    try:
        return pynvml.nvmlDeviceGetCount() >= 1
    except Exception:
        return False
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


class NvmlBackend:
    """Reads the inventory from NVML. Holds NVML initialised until :meth:`close`."""

    name = "nvml"

    def __init__(self, node: str = "node"):
        try:
            import pynvml
        except ImportError as exc:
            raise BackendUnavailable("pynvml is not installed (pip install nvidia-ml-py)") from exc
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            raise BackendUnavailable(f"NVML did not initialise: {exc}") from exc
        self._nvml = pynvml
        self._node = node
        self._open = True

    def inventory(self) -> list[GpuInfo]:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.error("NVML could not count GPUs: %s", exc)
            return []
        gpus = []
        for index in range(count):
            gpu = self._read_gpu(index)
            if gpu is not None:
                gpus.append(gpu)
        return gpus

    def _read_gpu(self, index: int) -> GpuInfo | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        except nvml.NVMLError as exc:
            log.warning("GPU %d left out of the inventory: cannot read its memory: %s", index, exc)
            return None
        if memory_mib <= 0:
            log.warning("GPU %d left out of the inventory: NVML reports %d MiB", index, memory_mib)
            return None
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))[:128] or None
        except nvml.NVMLError as exc:
            log.warning("GPU %d: cannot read UUID: %s", index, exc)
            uuid = None
        try:
            model = _text(nvml.nvmlDeviceGetName(handle))[:64] or "unknown"
        except nvml.NVMLError as exc:
            log.warning("GPU %d: cannot read name: %s", index, exc)
            model = "unknown"
        return GpuInfo(
            index=index,
            # Unique per node at least, so the control plane can still tell the GPUs apart.
            uuid=uuid or f"GPU-unknown-{self._node}-{index}",
            model=model,
            memory_mib=memory_mib,
        )

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.warning("nvmlShutdown failed: %s", exc)
