"""The NVML backend against a fake ``pynvml`` module (no GPU needed)."""

from __future__ import annotations

import sys
import types

import pytest

from agents.backends import nvml
from agents.backends.base import BackendUnavailable, GpuBackend

MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus, *, fail=None, init_error=None):
    """A stand-in for pynvml; ``fail`` maps (function name, index) to a failure."""
    fail = fail or {}
    calls = {"init": 0, "shutdown": 0}

    def init():
        calls["init"] += 1
        if init_error:
            raise init_error

    def shutdown():
        calls["shutdown"] += 1

    def field(name):
        def getter(handle):
            if (name, handle) in fail:
                raise FakeNVMLError(f"{name} failed")
            return gpus[handle][name]

        return getter

    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.nvmlInit = init
    module.nvmlShutdown = shutdown
    module.nvmlDeviceGetCount = lambda: len(gpus)
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetUUID = field("uuid")
    module.nvmlDeviceGetName = field("name")
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=field("memory")(handle))
    module.calls = calls
    return module


TWO_GPUS = [
    {"uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-80GB", "memory": 81920 * MIB},
    {"uuid": b"GPU-bbbb", "name": b"NVIDIA A100-SXM4-80GB", "memory": 81920 * MIB + 123},
]


def test_inventory_reads_every_gpu(monkeypatch):
    fake = fake_pynvml(TWO_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = nvml.NvmlBackend("n1")
    assert isinstance(backend, GpuBackend)
    gpus = backend.inventory()
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920),
        (1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 81920),  # bytes from old pynvml decoded
    ]
    backend.close()
    backend.close()
    assert fake.calls == {"init": 1, "shutdown": 1}


def test_unreadable_name_and_uuid_degrade_instead_of_crashing(monkeypatch):
    fake = fake_pynvml(TWO_GPUS, fail={("name", 1): True, ("uuid", 1): True})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = nvml.NvmlBackend("n1").inventory()
    assert gpus[0].model == "NVIDIA A100-SXM4-80GB"
    assert (gpus[1].model, gpus[1].uuid, gpus[1].memory_mib) == ("unknown", "GPU-unknown-n1-1", 81920)


def test_gpu_with_unreadable_memory_is_left_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS, fail={("memory", 0): True}))
    gpus = nvml.NvmlBackend("n1").inventory()
    assert [gpu.index for gpu in gpus] == [1]


def test_available_needs_init_and_at_least_one_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS))
    assert nvml.available() is True
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    assert nvml.available() is False
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS, init_error=FakeNVMLError("no driver")))
    assert nvml.available() is False


def test_missing_library_means_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert nvml.available() is False
    with pytest.raises(BackendUnavailable, match="pynvml is not installed"):
        nvml.NvmlBackend("n1")


def test_init_failure_is_reported_as_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS, init_error=FakeNVMLError("Driver Not Loaded")))
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        nvml.NvmlBackend("n1")
