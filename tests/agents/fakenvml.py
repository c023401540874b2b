"""A stand-in for the ``pynvml`` module: enough of NVML's surface for the backend, no GPU needed.

Build one with :func:`fake_pynvml` and install it with ``monkeypatch.setitem(sys.modules,
"pynvml", fake)``. Handles are the GPU indices. ``fail`` maps ``(function, index)`` to the NVML
error code that call raises (``NOT_SUPPORTED`` by default), ``index`` ``None`` meaning any GPU.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

MIB = 1024 * 1024

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

_NAMES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED, message: str | None = None):
        super().__init__(message or _NAMES.get(value, f"NVML error {value}"))
        self.value = value


@dataclass
class FakeGpu:
    uuid: str | bytes = "GPU-aaaa"
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    total_bytes: int = 81920 * MIB
    used_bytes: int = 1024 * MIB
    util_gpu: int = 87
    util_memory: int = 41
    temperature: int = 63
    power_mw: int = 251_500
    sm_clock: int = 1410
    mem_clock: int = 1593
    ecc_uncorrected: int = 0
    #: (pid, bytes or None) as nvmlDeviceGetComputeRunningProcesses lists them
    compute: list = field(default_factory=list)
    graphics: list = field(default_factory=list)
    #: (pid, timeStamp, smUtil) samples from nvmlDeviceGetProcessUtilization
    process_util: list = field(default_factory=list)
    bus_id: str = "00000000:07:00.0"
    #: per link: (active, remote bus id); None means NVLink is not supported on this GPU
    nvlinks: list | None = None


def fake_pynvml(gpus: list[FakeGpu], *, fail=None, init_error=None, topology=None, xids=None):
    """A module object standing in for pynvml; ``calls`` records what the backend asked."""
    fail = dict(fail or {})
    topology = dict(topology or {})
    events = list(xids or [])  # (gpu index, xid code), delivered in order
    calls: dict = {"init": 0, "shutdown": 0, "event_waits": [], "util_since": [], "registered": []}
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_NVLINK_MAX_LINKS = 12
    module.calls = calls
    module.events = events
    module.fail = fail  # tests may add failures later (a GPU falling off the bus)

    def check(function: str, index):
        for key in ((function, index), (function, None)):
            if key in fail:
                raise FakeNVMLError(fail[key])

    def gpu_call(function: str, getter):
        def call(handle, *args):
            check(function, handle)
            return getter(gpus[handle], *args)

        return call

    def init():
        calls["init"] += 1
        if init_error:
            raise init_error

    def shutdown():
        calls["shutdown"] += 1

    def count():
        check("count", None)
        return len(gpus)

    def handle_by_index(index):
        check("handle", index)
        if not 0 <= index < len(gpus):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return index

    def processes(entries):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in entries]

    def temperature(gpu, sensor):
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return gpu.temperature

    def clock(gpu, which):
        return {1: gpu.sm_clock, 2: gpu.mem_clock}[which]

    def ecc(gpu, error_type, counter_type):
        assert (error_type, counter_type) == (1, 0)  # uncorrected, volatile
        return gpu.ecc_uncorrected

    def process_utilization(handle, since):
        check("process_util", handle)
        calls["util_since"].append((handle, since))
        samples = [
            types.SimpleNamespace(pid=pid, timeStamp=stamp, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, stamp, sm in gpus[handle].process_util
            if stamp > since
        ]
        if not samples:
            raise FakeNVMLError(NVML_ERROR_NOT_FOUND)
        return samples

    def nvlink_state(handle, link):
        check("nvlink", handle)
        links = gpus[handle].nvlinks
        if links is None:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(links[link][0])

    def nvlink_remote(handle, link):
        check("nvlink_remote", handle)
        return types.SimpleNamespace(busId=gpus[handle].nvlinks[link][1].encode())

    def common_ancestor(a, b):
        check("topology", a)
        return topology.get((a, b), topology.get((b, a), NVML_TOPOLOGY_SYSTEM))

    def event_set_create():
        check("event_set", None)
        return "event-set"

    def register_events(handle, types_mask, event_set):
        check("register_events", handle)
        assert types_mask == 8 and event_set == "event-set"
        calls["registered"].append(handle)

    def event_wait(event_set, timeout_ms):
        calls["event_waits"].append(timeout_ms)
        while events:
            index, code = events.pop(0)
            if index in calls["registered"]:
                return types.SimpleNamespace(device=index, eventType=8, eventData=code)
        raise FakeNVMLError(NVML_ERROR_TIMEOUT)

    module.nvmlInit = init
    module.nvmlShutdown = shutdown
    module.nvmlDeviceGetCount = count
    module.nvmlDeviceGetHandleByIndex = handle_by_index
    module.nvmlDeviceGetIndex = lambda handle: handle
    module.nvmlDeviceGetUUID = gpu_call("uuid", lambda g: g.uuid)
    module.nvmlDeviceGetName = gpu_call("name", lambda g: g.name)
    module.nvmlDeviceGetMemoryInfo = gpu_call(
        "memory", lambda g: types.SimpleNamespace(total=g.total_bytes, used=g.used_bytes, free=g.total_bytes - g.used_bytes)
    )
    module.nvmlDeviceGetUtilizationRates = gpu_call(
        "utilization", lambda g: types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)
    )
    module.nvmlDeviceGetTemperature = gpu_call("temperature", temperature)
    module.nvmlDeviceGetPowerUsage = gpu_call("power", lambda g: g.power_mw)
    module.nvmlDeviceGetClockInfo = gpu_call("clock", clock)
    module.nvmlDeviceGetTotalEccErrors = gpu_call("ecc", ecc)
    module.nvmlDeviceGetComputeRunningProcesses = gpu_call("compute", lambda g: processes(g.compute))
    module.nvmlDeviceGetGraphicsRunningProcesses = gpu_call("graphics", lambda g: processes(g.graphics))
    module.nvmlDeviceGetProcessUtilization = process_utilization
    module.nvmlDeviceGetPciInfo = gpu_call("pci", lambda g: types.SimpleNamespace(busId=g.bus_id.encode()))
    module.nvmlDeviceGetNvLinkState = nvlink_state
    module.nvmlDeviceGetNvLinkRemotePciInfo = nvlink_remote
    module.nvmlDeviceGetTopologyCommonAncestor = common_ancestor
    module.nvmlEventSetCreate = event_set_create
    module.nvmlDeviceRegisterEvents = register_events
    module.nvmlEventSetWait = event_wait
    module.nvmlEventSetFree = lambda event_set: None
    return module
