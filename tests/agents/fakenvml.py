"""A stand-in for the ``pynvml`` module: enough of NVML's surface for the backend, no GPU needed.

Build one with :func:`fake_pynvml` and install it with ``monkeypatch.setitem(sys.modules,
"pynvml", fake)``. Handles are the GPU indices. ``fail`` maps ``(function, index)`` to the NVML
error code that call raises (``NOT_SUPPORTED`` by default), ``index`` ``None`` meaning any GPU.

MIG: a :class:`FakeGpu` whose ``mig`` is a list is in MIG mode, each entry one MIG device slot
(``None``: an empty slot, NOT_FOUND as on a real GPU). A MIG device's handle is the tuple
``(gpu index, slot)``, and so is its key in ``fail``. Like a real driver, a MIG handle answers
memory, UUID, name, attributes and its compute processes, and NOT_SUPPORTED to utilisation,
power, clocks, temperature and ECC. ``profile_names=False`` stands for a binding whose profile
info has no ``name`` (before the v2 struct): the backend must build the name from the figures.
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
NVML_ERROR_FUNCTION_NOT_FOUND = 13

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
#: Slots per GPU that nvmlDeviceGetMaxMigDeviceCount reports on A100/H100.
MAX_MIG_DEVICES = 7

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
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
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
    #: MIG devices by slot (None: an empty slot); None means MIG mode is off
    mig: list | None = None


@dataclass
class FakeMig:
    """One MIG device: a compute instance inside a GPU instance of some profile."""

    uuid: str | bytes = "MIG-aaaa"
    #: the GPU instance profile as NVML names it in the v2 profile info ("MIG 1g.10gb")
    profile_name: str = "MIG 1g.10gb"
    #: NVML's profile id (nvmlGpuInstanceInfo_t.profileId) and profile index (NVML_GPU_INSTANCE_PROFILE_*)
    profile_id: int = 19
    profile_index: int = 0
    slices: int = 1
    #: the profile's memorySizeMB (MiB), what nvidia-smi mig -lgip shows
    profile_memory_mb: int = 9728
    #: None: the compute instance spans the whole GPU instance
    compute_slices: int | None = None
    gpu_instance_id: int = 13
    total_bytes: int = 9728 * MIB
    used_bytes: int = 0
    compute: list = field(default_factory=list)


def fake_pynvml(gpus: list[FakeGpu], *, fail=None, init_error=None, topology=None, xids=None, profile_names=True):
    """A module object standing in for pynvml; ``calls`` records what the backend asked."""
    fail = dict(fail or {})
    topology = dict(topology or {})
    events = list(xids or [])  # (gpu index, xid code), delivered in order
    calls: dict = {"init": 0, "shutdown": 0, "event_waits": [], "util_since": [], "registered": [], "mig_reads": []}
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

    def gpu_call(function: str, getter, *, mig=None):
        """``getter(gpu, *args)`` for a GPU handle; ``mig(instance, *args)`` for a MIG handle
        (NOT_SUPPORTED without one, as the driver answers for per-GPU readings)."""

        def call(handle, *args):
            check(function, handle)
            if isinstance(handle, tuple):
                calls["mig_reads"].append((function, handle))
                if mig is None:
                    raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
                return mig(mig_device(handle), *args)
            return getter(gpus[handle], *args)

        return call

    def mig_device(handle):
        index, slot = handle
        return gpus[index].mig[slot]

    def memory_info(device):
        return types.SimpleNamespace(
            total=device.total_bytes, used=device.used_bytes, free=device.total_bytes - device.used_bytes
        )

    def mig_mode(handle):
        check("mig_mode", handle)
        mode = NVML_DEVICE_MIG_DISABLE if gpus[handle].mig is None else NVML_DEVICE_MIG_ENABLE
        return [mode, mode]

    def max_mig_devices(handle):
        check("max_mig", handle)
        return MAX_MIG_DEVICES if gpus[handle].mig is not None else 0

    def mig_handle_by_index(handle, slot):
        check("mig_handle", (handle, slot))
        slots = gpus[handle].mig
        if slots is None or slot >= MAX_MIG_DEVICES:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(slots) or slots[slot] is None:
            raise FakeNVMLError(NVML_ERROR_NOT_FOUND)
        return (handle, slot)

    def parent_of(handle):
        if not isinstance(handle, tuple):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle[0]

    def instance_id(handle):
        check("gpu_instance_id", handle)
        if not isinstance(handle, tuple):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return mig_device(handle).gpu_instance_id

    def instances_of(parent):
        return [device for device in gpus[parent].mig or [] if device is not None]

    def instance_by_id(parent, gpu_instance_id):
        check("gpu_instance", parent)
        for device in instances_of(parent):
            if device.gpu_instance_id == gpu_instance_id:
                return ("gi", parent, gpu_instance_id)
        raise FakeNVMLError(NVML_ERROR_NOT_FOUND)

    def instance_info(gpu_instance):
        _, parent, gpu_instance_id = gpu_instance
        check("gpu_instance_info", parent)
        device = next(d for d in instances_of(parent) if d.gpu_instance_id == gpu_instance_id)
        return types.SimpleNamespace(device=parent, id=gpu_instance_id, profileId=device.profile_id)

    def profile_info(device, named: bool):
        info = types.SimpleNamespace(
            id=device.profile_id, sliceCount=device.slices, instanceCount=1,
            multiprocessorCount=16 * device.slices, memorySizeMB=device.profile_memory_mb,
        )
        if named:
            info.name = device.profile_name.encode()  # a c_char array reads as bytes
        return info

    def profile_by_index(parent, profile_index, version=2):
        check("profile_info", parent)
        for device in instances_of(parent):
            if device.profile_index == profile_index:
                return profile_info(device, named=profile_names and version == 2)
        raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)  # a profile this GPU does not offer

    def profile_by_id(parent, profile_id):
        check("profile_info_by_id", parent)
        for device in instances_of(parent):
            if device.profile_id == profile_id:
                return profile_info(device, named=True)
        raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def attributes(device):
        return types.SimpleNamespace(
            multiprocessorCount=16 * (device.compute_slices or device.slices),
            gpuInstanceSliceCount=device.slices,
            computeInstanceSliceCount=device.compute_slices or device.slices,
            memorySizeMB=device.profile_memory_mb,
        )

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
        if isinstance(handle, tuple):
            calls["mig_reads"].append(("process_util", handle))
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
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
    module.nvmlDeviceGetUUID = gpu_call("uuid", lambda g: g.uuid, mig=lambda m: m.uuid)
    module.nvmlDeviceGetName = gpu_call("name", lambda g: g.name, mig=lambda m: f"MIG {m.profile_name}")
    module.nvmlDeviceGetMemoryInfo = gpu_call("memory", memory_info, mig=memory_info)
    module.nvmlDeviceGetUtilizationRates = gpu_call(
        "utilization", lambda g: types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)
    )
    module.nvmlDeviceGetTemperature = gpu_call("temperature", temperature)
    module.nvmlDeviceGetPowerUsage = gpu_call("power", lambda g: g.power_mw)
    module.nvmlDeviceGetClockInfo = gpu_call("clock", clock)
    module.nvmlDeviceGetTotalEccErrors = gpu_call("ecc", ecc)
    module.nvmlDeviceGetComputeRunningProcesses = gpu_call(
        "compute", lambda g: processes(g.compute), mig=lambda m: processes(m.compute)
    )
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
    module.NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    module.NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    module.nvmlDeviceGetMigMode = mig_mode
    module.nvmlDeviceGetMaxMigDeviceCount = max_mig_devices
    module.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle_by_index
    module.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = parent_of
    module.nvmlDeviceIsMigDeviceHandle = lambda handle: int(isinstance(handle, tuple))
    module.nvmlDeviceGetGpuInstanceId = instance_id
    module.nvmlDeviceGetGpuInstanceById = instance_by_id
    module.nvmlGpuInstanceGetInfo = instance_info
    module.nvmlDeviceGetGpuInstanceProfileInfo = profile_by_index
    module.nvmlDeviceGetAttributes = gpu_call("attributes", lambda g: _raise(NVML_ERROR_NOT_SUPPORTED), mig=attributes)
    if profile_names:
        module.nvmlDeviceGetGpuInstanceProfileInfoV = profile_by_index
        module.nvmlDeviceGetGpuInstanceProfileInfoById = profile_by_id
    return module


def _raise(code: int):
    raise FakeNVMLError(code)
