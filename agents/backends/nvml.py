"""The real GPU backend: NVIDIA's management library through ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported inside functions so this module imports on machines without it (the
control plane, CI, laptops); only constructing :class:`NvmlBackend` needs the library.

Degrade, never die: every NVML call goes through :meth:`NvmlBackend._read`, which turns any
failure (``NVMLError`` including NOT_SUPPORTED on a GPU model, or a pynvml too old to have the
function) into ``None``, "unknown" on the wire, and logs each distinct failure once. A GPU whose
name or UUID cannot be read is still reported, with a placeholder; one whose memory cannot be
read is left out of the inventory, because the scheduler would pack against a made-up number.

MIG: a GPU whose current MIG mode is enabled is listed as its MIG devices instead of itself, one
:class:`GpuInfo` per MIG device (isolation ``mig``, its ``MIG-...`` UUID, its own memory, the GPU
instance profile, ``parent_index`` = the GPU's NVML index). A GPU's devices are numbered from
``max(next free number, its NVML index)``: without MIG every GPU keeps its NVML index exactly as
before, and a whole GPU after a MIG GPU is pushed up, so on a node with MIG devices the number is
not what ``CUDA_VISIBLE_DEVICES`` counts: jobs must be pointed at devices by UUID. A MIG device
answers its memory and its processes; utilisation and power are read per GPU and NVML does not
split them per instance (utilisation is NOT_SUPPORTED in MIG mode), so they are unknown, while
temperature, clocks and ECC are facts of the board and are reported for each of its instances. An
XID on a GPU is reported on every device of that GPU. Two instances of one GPU are linked
``same_board``; a MIG GPU has no peer-to-peer (NVLink or PCIe) with other GPUs, so links from its
instances are the PCIe level of the two GPUs, never ``nvlink``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from agents.backends.base import BackendSample, BackendUnavailable, JobProcesses
from agents import protocol
from agents.backends import nvml_readings as readings
from agents.backends.pids import PidOwners
from agents.protocol import GpuInfo, GpuLink, GpuSample, JobGpuSample

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# NVML ABI values (nvml.h). pynvml exports the same numbers under these names; spelling them out
# here keeps this module working with old or partial bindings.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12  # profile indices to scan when the binding has no by-id lookup
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_NVLINK_MAX_LINKS = 18  # pynvml's own constant wins when it has one (newer parts have more)

# nvmlDeviceGetTopologyCommonAncestor levels -> GpuLink.kind. NODE (across host bridges inside
# one NUMA node) stays on the PCIe side of the socket, so it counts as a host bridge; only SYSTEM
# crosses the CPU interconnect (QPI/UPI/Infinity Fabric).
TOPOLOGY_KINDS = {
    0: "same_board",  # INTERNAL: two GPUs on one board
    10: "pcie_switch",  # SINGLE: one PCIe switch
    20: "pcie_switch",  # MULTIPLE: several PCIe switches, no host bridge
    30: "pcie_host_bridge",  # HOSTBRIDGE
    40: "pcie_host_bridge",  # NODE
    50: "system",  # SYSTEM
}
#: Per link and direction for NVLink 2-4 (V100, A100, H100), in Gbit/s (25 GB/s).
NVLINK_GBPS_PER_LINK = 200.0
#: Bound on XID events drained per sample, so a storm cannot stall the agent loop.
MAX_EVENTS_PER_SAMPLE = 256



@dataclass(frozen=True)
class _Device:
    """What one schedulable device is in NVML: a whole GPU, or a MIG device on a GPU."""

    nvml_index: int  # the GPU's; for a MIG device, the GPU it lives on
    gpu: Any
    mig: Any = None

    @property
    def handle(self):
        """The handle per-device readings (memory, processes) go through."""
        return self.gpu if self.mig is None else self.mig



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
    """Reads the inventory, topology and per-interval samples from NVML.

    Holds NVML initialised (and an XID event set) until :meth:`close`.
    """

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
        self._handles: dict[int, _Device] = {}
        self._profiles: dict[tuple[int, int], Any] = {}  # (GPU, profile id) -> profile info
        self._empty_mig_logged: set[int] = set()
        self._failures: set[tuple[str, int | None, str]] = set()
        self._event_set = None
        self._events_tried = False
        self._util_seen: dict[int, int] = {}  # per GPU: newest per-process utilisation timestamp
        self._topology: list[GpuLink] | None = None

    # ------------------------------------------------------------------ degrade, log once

    def _read(self, what: str, index: int | None, call: Callable, *args):
        """``call(*args)``, or ``None`` when it fails; each distinct failure is logged once."""
        try:
            return call(*args)
        except Exception as exc:  # NVMLError above all; a missing binding or a bad value too
            self._failed(what, index, exc)
            return None

    def _failed(self, what: str, index: int | None, exc: BaseException) -> None:
        try:
            reason = str(exc) or type(exc).__name__
        except Exception:  # pynvml's __str__ calls into the library, which may be gone
            reason = f"{type(exc).__name__} {getattr(exc, 'value', '')}".strip()
        key = (what, index, reason)
        if key in self._failures:
            return
        if len(self._failures) < 10_000:
            self._failures.add(key)
        where = "NVML" if index is None else f"GPU {index}"
        log.warning("%s: cannot read %s: %s (reported as unknown; logged once)", where, what, reason)

    # ------------------------------------------------------------------ inventory

    def inventory(self) -> list[GpuInfo]:
        nvml = self._nvml
        count = self._read("the GPU count", None, nvml.nvmlDeviceGetCount)
        if count is None:
            return []
        gpus = []
        devices: dict[int, _Device] = {}
        next_free = 0
        for nvml_index in range(count):
            for info, device in self._read_gpu(nvml_index, max(next_free, nvml_index)):
                gpus.append(info)
                devices[info.index] = device
                next_free = info.index + 1
        self._handles = devices
        return gpus

    def _read_gpu(self, index: int, first: int) -> list[tuple[GpuInfo, _Device]]:
        """The schedulable devices of NVML's GPU ``index``, numbered from ``first``: the GPU
        itself, or its MIG devices when MIG mode is on."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            log.warning("GPU %d left out of the inventory: cannot read its memory: %s", index, exc)
            return []
        model = self._read("name", index, nvml.nvmlDeviceGetName, handle)
        model = (readings.text(model)[:64] if model is not None else "") or "unknown"
        if self._mig_enabled(index, handle):
            return self._read_mig_devices(index, handle, model, first)
        try:
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        except Exception as exc:
            log.warning("GPU %d left out of the inventory: cannot read its memory: %s", index, exc)
            return []
        if memory_mib <= 0:
            log.warning("GPU %d left out of the inventory: NVML reports %d MiB", index, memory_mib)
            return []
        if first >= protocol.MAX_GPUS:
            log.warning("GPU %d left out of the inventory: a node reports at most %d devices", index, protocol.MAX_GPUS)
            return []
        uuid = self._read("UUID", index, nvml.nvmlDeviceGetUUID, handle)
        info = GpuInfo(
            index=first,
            # Unique per node at least, so the control plane can still tell the GPUs apart.
            uuid=(readings.text(uuid)[:128] if uuid is not None else "") or f"GPU-unknown-{self._node}-{index}",
            model=model,
            memory_mib=memory_mib,
        )
        return [(info, _Device(index, handle))]

    def _devices(self) -> dict[int, _Device]:
        if not self._handles:
            self.inventory()
        return self._handles

    # ------------------------------------------------------------------ MIG

    def _mig_enabled(self, index: int, handle) -> bool:
        """Whether the GPU's *current* MIG mode is on (a pending change needs a GPU reset first)."""
        get_mode = getattr(self._nvml, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False  # a pynvml from before MIG
        try:
            current = get_mode(handle)[0]
        except Exception as exc:
            # NOT_SUPPORTED: a GPU without MIG (before Ampere, consumer boards); FUNCTION_NOT_FOUND:
            # a driver from before MIG. Both are the common case, not worth a warning.
            if getattr(exc, "value", None) not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._failed("MIG mode (listed as a whole GPU)", index, exc)
            return False
        return current == NVML_DEVICE_MIG_ENABLE

    def _read_mig_devices(self, index: int, gpu, model: str, first: int) -> list[tuple[GpuInfo, _Device]]:
        nvml = self._nvml
        slots = self._read("MIG device count", index, nvml.nvmlDeviceGetMaxMigDeviceCount, gpu)
        found = []
        for slot in range(int(slots or 0)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
            except Exception as exc:
                if getattr(exc, "value", None) != NVML_ERROR_NOT_FOUND:  # NOT_FOUND: an empty slot
                    self._failed(f"MIG device {slot}", index, exc)
                continue
            number = first + len(found)
            if number >= protocol.MAX_GPUS:
                log.warning("GPU %d: MIG device %d left out: a node reports at most %d devices",
                            index, slot, protocol.MAX_GPUS)
                break
            info = self._read_mig_device(index, slot, gpu, mig, model, number)
            if info is not None:
                found.append((info, _Device(index, gpu, mig)))
        if not found and index not in self._empty_mig_logged:
            self._empty_mig_logged.add(index)
            log.warning("GPU %d is in MIG mode but has no MIG device to run jobs on; it offers nothing "
                        "until instances are created (nvidia-smi mig -cgi PROFILES -C)", index)
        return found

    def _read_mig_device(self, index: int, slot: int, gpu, mig, model: str, number: int) -> GpuInfo | None:
        """One MIG device, or ``None`` (logged) when what makes it usable cannot be read: its
        memory (the scheduler packs against it), its UUID (the only way CUDA finds it) or its
        profile (what jobs ask for)."""
        nvml = self._nvml
        where = f"GPU {index}: MIG device {slot} left out of the inventory"
        try:
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB
        except Exception as exc:
            log.warning("%s: cannot read its memory: %s", where, exc)
            return None
        uuid = self._read(f"MIG device {slot} UUID", index, nvml.nvmlDeviceGetUUID, mig)
        uuid = readings.text(uuid)[:128] if uuid is not None else ""
        profile = self._mig_profile(index, gpu, mig)
        if memory_mib <= 0 or not uuid.startswith("MIG-") or profile is None:
            log.warning("%s: memory %d MiB, UUID %r, profile %r", where, memory_mib, uuid, profile)
            return None
        return GpuInfo(
            index=number, uuid=uuid, model=model, memory_mib=memory_mib,
            isolation="mig", mig_profile=profile, parent_index=index,
        )

    def _mig_profile(self, index: int, gpu, mig) -> str | None:
        """``1g.10gb`` as nvidia-smi names it; ``1c.3g.40gb`` when the compute instance holds
        fewer slices than its GPU instance."""
        nvml = self._nvml
        attributes = None
        if hasattr(nvml, "nvmlDeviceGetAttributes"):
            attributes = self._read("MIG device attributes", index, nvml.nvmlDeviceGetAttributes, mig)
        gpu_slices = readings.count(getattr(attributes, "gpuInstanceSliceCount", None))
        compute_slices = readings.count(getattr(attributes, "computeInstanceSliceCount", None))
        profile = self._gpu_instance_profile(index, gpu, mig)
        if profile is None and attributes is not None:
            profile = readings.built_profile(gpu_slices, getattr(attributes, "memorySizeMB", None))
        if profile is None:
            return None
        if compute_slices and gpu_slices and compute_slices < gpu_slices:
            profile = f"{compute_slices}c.{profile}"
        return profile if readings.MIG_PROFILE.match(profile) else None

    def _gpu_instance_profile(self, index: int, gpu, mig) -> str | None:
        """The profile of the GPU instance the MIG device belongs to: its NVML name where the
        binding has one (the v2 profile info), else built from its slices and memory.

        GPU instance handles need a privileged user on some drivers: the failure is logged once
        per GPU, not per device, and the caller falls back on the device's attributes."""
        nvml = self._nvml
        try:
            instance_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
            instance = nvml.nvmlDeviceGetGpuInstanceById(gpu, instance_id)
            profile_id = int(nvml.nvmlGpuInstanceGetInfo(instance).profileId)
        except Exception as exc:
            self._failed("MIG GPU instance profiles", index, exc)
            return None
        info = self._profile_info(index, gpu, profile_id)
        if info is None:
            return None
        return readings.profile_name(getattr(info, "name", None)) or readings.built_profile(
            readings.count(getattr(info, "sliceCount", None)), getattr(info, "memorySizeMB", None)
        )

    def _profile_info(self, index: int, gpu, profile_id: int):
        """NVML's description of GPU instance profile ``profile_id``, cached (it never changes)."""
        key = (index, profile_id)
        if key in self._profiles:
            return self._profiles[key]
        nvml = self._nvml
        info = None
        by_id = getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfoById", None)
        if by_id is not None:
            info = self._read("GPU instance profile", index, by_id, gpu, profile_id)
        if info is None:
            # Older bindings and drivers: look the id up among the profile indices. Most
            # indices are profiles this GPU does not offer, which NVML refuses: not an error.
            by_index = (getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
                        or nvml.nvmlDeviceGetGpuInstanceProfileInfo)
            profiles = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", NVML_GPU_INSTANCE_PROFILE_COUNT))
            for profile_index in range(profiles):
                try:
                    candidate = by_index(gpu, profile_index)
                except Exception:
                    continue
                if getattr(candidate, "id", None) == profile_id:
                    info = candidate
                    break
            else:
                log.warning("GPU %d: GPU instance profile %d is not among the profiles NVML lists", index, profile_id)
        self._profiles[key] = info
        return info

    # ------------------------------------------------------------------ topology

    def topology(self) -> list[GpuLink]:
        """Every pair of GPUs: NVLink when an active link joins them (directly or through
        NVSwitch), else the PCIe level of their common ancestor. Read once; it does not change."""
        if self._topology is not None:
            return list(self._topology)
        nvml = self._nvml
        devices = self._devices()
        # NVLinks are counted between whole GPUs only: MIG mode turns peer-to-peer off.
        mig_gpus = {d.nvml_index: d.gpu for d in devices.values() if d.mig is not None}
        direct, switched = self._nvlinks({i: d.gpu for i, d in devices.items() if d.mig is None}, mig_gpus)
        levels: dict[tuple[int, int], str] = {}  # per pair of NVML GPUs, read once
        links = []
        indices = sorted(devices)
        for position, a in enumerate(indices):
            for b in indices[position + 1:]:
                first, second = devices[a], devices[b]
                if first.nvml_index == second.nvml_index:  # two MIG devices of one GPU
                    links.append(GpuLink(a=a, b=b, kind="same_board"))
                    continue
                count = direct.get((a, b), 0) or min(switched.get(a, 0), switched.get(b, 0))
                if count:
                    links.append(GpuLink(a=a, b=b, kind="nvlink", bandwidth_gbps=count * NVLINK_GBPS_PER_LINK))
                    continue
                pair = (first.nvml_index, second.nvml_index)
                if pair not in levels:
                    level = self._read(
                        "topology", a, nvml.nvmlDeviceGetTopologyCommonAncestor, first.gpu, second.gpu
                    )
                    levels[pair] = TOPOLOGY_KINDS.get(int(level), "unknown") if level is not None else "unknown"
                links.append(GpuLink(a=a, b=b, kind=levels[pair]))
        self._topology = links
        return list(links)

    def _nvlinks(
        self, devices: dict[int, Any], mig_gpus: Mapping[int, Any] | None = None
    ) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
        """Active NVLinks: per GPU pair (a < b) joined directly, and per GPU into an NVSwitch.

        A link whose far end is not one of this node's GPUs is counted as going into a switch
        (NVSwitch systems; on IBM POWER it could be the CPU's NPU, which we do not tell apart).
        A link into a GPU in MIG mode (``mig_gpus``, by NVML index) carries no peer traffic and
        is not counted at all.
        """
        nvml = self._nvml
        by_bus: dict[tuple[int, int, int], int | None] = {}
        for index, handle in (mig_gpus or {}).items():
            key = readings.bus_key(self._read("PCI info", index, nvml.nvmlDeviceGetPciInfo, handle))
            if key is not None:
                by_bus[key] = None
        for index, handle in devices.items():
            key = readings.bus_key(self._read("PCI info", index, nvml.nvmlDeviceGetPciInfo, handle))
            if key is not None:
                by_bus[key] = index
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVML_NVLINK_MAX_LINKS))
        direct: dict[tuple[int, int], int] = {}
        switched: dict[int, int] = {}
        for index, handle in devices.items():
            for link in range(max_links):
                try:
                    active = nvml.nvmlDeviceGetNvLinkState(handle, link)
                except Exception as exc:
                    # NOT_SUPPORTED on link 0: a PCIe-only GPU. INVALID_ARGUMENT later: no more
                    # links. Either way this GPU's list ends here.
                    if link == 0:
                        log.info("GPU %d: no NVLink (%s)", index, exc)
                    break
                if not active:
                    continue
                remote = readings.bus_key(
                    self._read("NVLink peer", index, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link))
                if remote is None:
                    continue
                if remote in by_bus and by_bus[remote] is None:
                    continue  # into a MIG GPU
                peer = by_bus.get(remote)
                if peer is None:
                    switched[index] = switched.get(index, 0) + 1
                elif peer > index:  # each link is seen from both ends; count it from the lower one
                    direct[(index, peer)] = direct.get((index, peer), 0) + 1
        return direct, switched

    # ------------------------------------------------------------------ sampling

    def sample(self, jobs: Mapping[int, JobProcesses]) -> BackendSample:
        devices = self._devices()
        xids = self._drain_xids()
        owners = PidOwners(jobs)
        gpus = []
        job_samples = []
        unattributed: dict[int, int] = {}
        boards: dict[int, dict] = {}  # per MIG GPU, its board readings, read once per sample
        for index, device in devices.items():
            device_xids = xids.get(device.nvml_index, [])
            if device.mig is None:
                gpus.append(self._gpu_sample(index, device.gpu, device_xids))
            else:
                gpus.append(self._mig_sample(index, device, device_xids, boards))
            processes = self._processes(index, device.handle, graphics=device.mig is None)
            if processes is None:
                continue  # unknown: neither per-job nor unattributed figures for this GPU
            # Per-process utilisation is not kept per MIG device: unknown, not zero.
            util = self._process_util(index, device.handle) if device.mig is None else None
            unattributed[index] = 0
            per_job: dict[int, list] = {}  # job id -> [known MiB or None, util or None]
            for pid, memory_mib in processes.items():
                job_id = owners.job_of(pid)
                if job_id is None:
                    unattributed[index] += memory_mib or 0
                    continue
                entry = per_job.setdefault(job_id, [None, None])
                if memory_mib is not None:
                    entry[0] = (entry[0] or 0) + memory_mib
                if util is not None:
                    entry[1] = (entry[1] or 0.0) + util.get(pid, 0.0)
            for job_id, (memory_mib, job_util) in per_job.items():
                if memory_mib is None:
                    continue  # every process of the job hid its memory (e.g. WDDM): unknown
                job_samples.append(
                    JobGpuSample(
                        job_id=job_id,
                        gpu_index=index,
                        mem_used_mib=memory_mib,
                        util_sm=None if job_util is None else min(100.0, job_util),
                    )
                )
        return BackendSample(gpus=gpus, jobs=job_samples, unattributed_mib=unattributed)

    def _gpu_sample(self, index: int, handle, xids: list[int]) -> GpuSample:
        nvml = self._nvml
        rates = self._read("utilisation", index, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._read("memory", index, nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._read("power", index, nvml.nvmlDeviceGetPowerUsage, handle)
        return GpuSample(
            index=index,
            util_sm=readings.percent(getattr(rates, "gpu", None)),
            util_mem=readings.percent(getattr(rates, "memory", None)),
            mem_used_mib=readings.count(getattr(memory, "used", None), MIB, protocol.MEMORY_MIB_MAX),
            mem_total_mib=readings.count(getattr(memory, "total", None), MIB, protocol.MEMORY_MIB_MAX),
            power_w=(None if readings.number(power_mw, 0, protocol.POWER_W_MAX * 1000) is None
                     else round(power_mw / 1000.0, 1)),
            xid_events=xids[:64],
            **self._board_readings(index, handle),
        )

    def _mig_sample(self, index: int, device: _Device, xids: list[int], boards: dict[int, dict]) -> GpuSample:
        """A MIG device's own memory; its GPU's temperature, clocks and ECC count (one board, one
        clock domain); utilisation and power unknown (NVML does not split them per instance)."""
        nvml = self._nvml
        memory = self._read("memory", index, nvml.nvmlDeviceGetMemoryInfo, device.mig)
        board = boards.get(device.nvml_index)
        if board is None:
            board = boards[device.nvml_index] = self._board_readings(index, device.gpu)
        return GpuSample(
            index=index,
            mem_used_mib=readings.count(getattr(memory, "used", None), MIB, protocol.MEMORY_MIB_MAX),
            mem_total_mib=readings.count(getattr(memory, "total", None), MIB, protocol.MEMORY_MIB_MAX),
            xid_events=xids[:64],
            **board,
        )

    def _board_readings(self, index: int, handle) -> dict:
        nvml = self._nvml
        temperature = self._read("temperature", index, nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU)
        sm_clock = self._read("SM clock", index, nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_SM)
        mem_clock = self._read("memory clock", index, nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_MEM)
        ecc = self._read(
            "ECC errors",
            index,
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            NVML_VOLATILE_ECC,
        )
        return {
            "temperature_c": readings.number(temperature, protocol.TEMPERATURE_C_MIN, protocol.TEMPERATURE_C_MAX),
            "sm_clock_mhz": readings.count(sm_clock, high=protocol.CLOCK_MHZ_MAX),
            "mem_clock_mhz": readings.count(mem_clock, high=protocol.CLOCK_MHZ_MAX),
            "ecc_uncorrected": readings.count(ecc),
        }

    def _processes(self, index: int, handle, graphics: bool = True) -> dict[int, int | None] | None:
        """pid -> GPU memory in MiB (``None`` when NVML hides it); ``None`` if neither list reads.

        ``graphics=False`` for MIG devices, which run no graphics contexts (and would only log
        NOT_SUPPORTED)."""
        nvml = self._nvml
        compute = self._read("compute processes", index, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if not graphics:
            return None if compute is None else self._memory_by_pid(compute)
        graphics = self._read("graphics processes", index, nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
        if compute is None and graphics is None:
            return None
        return self._memory_by_pid(list(compute or []) + list(graphics or []))

    @staticmethod
    def _memory_by_pid(listed) -> dict[int, int | None]:
        processes: dict[int, int | None] = {}
        for process in listed:
            pid = getattr(process, "pid", None)
            if not isinstance(pid, int) or pid <= 0:
                continue
            used = getattr(process, "usedGpuMemory", None)
            memory_mib = readings.count(used, MIB, protocol.MEMORY_MIB_MAX)
            # A process doing compute and graphics is listed twice with the same figure.
            known = processes.get(pid)
            processes[pid] = memory_mib if known is None else max(known, memory_mib or 0)
        return processes

    def _process_util(self, index: int, handle) -> dict[int, float] | None:
        """pid -> SM utilisation over the last interval; a pid without samples was idle.

        ``None`` when the GPU cannot say (not supported): per-job utilisation is then unknown.
        """
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._util_seen.get(index, 0))
        except Exception as exc:
            # NOT_FOUND means "no samples since then"; pynvml also raises for SUCCESS with none.
            if getattr(exc, "value", None) in (NVML_ERROR_NOT_FOUND, NVML_SUCCESS):
                return {}
            self._failed("per-process utilisation", index, exc)
            return None
        latest: dict[int, tuple[int, float]] = {}
        newest = self._util_seen.get(index, 0)
        for sample in samples or []:
            stamp = int(getattr(sample, "timeStamp", 0) or 0)
            pid = getattr(sample, "pid", None)
            value = readings.percent(getattr(sample, "smUtil", None))
            newest = max(newest, stamp)
            if pid is None or value is None:
                continue
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, value)
        self._util_seen[index] = newest
        return {pid: value for pid, (_stamp, value) in latest.items()}

    # ------------------------------------------------------------------ XID events

    def _events(self):
        """The XID event set, created on first use; ``None`` where no GPU supports events."""
        if self._events_tried:
            return self._event_set
        self._events_tried = True
        nvml = self._nvml
        event_set = self._read("XID events (event set)", None, nvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        registered = 0
        # Events are the GPU's (a MIG GPU's XID concerns all its instances): register each once.
        gpus = {device.nvml_index: device.gpu for device in self._devices().values()}
        for index, handle in gpus.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
                registered += 1
            except Exception as exc:
                self._failed("XID events", index, exc)
        if not registered:
            self._read("XID events (free)", None, nvml.nvmlEventSetFree, event_set)
            return None
        self._event_set = event_set
        return event_set

    def _drain_xids(self) -> dict[int, list[int]]:
        """XID codes per NVML GPU index since the previous call, without blocking (timeout 0)."""
        event_set = self._events()
        if event_set is None:
            return {}
        nvml = self._nvml
        xids: dict[int, list[int]] = {}
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait(event_set, 0)
            except Exception as exc:
                if getattr(exc, "value", None) != NVML_ERROR_TIMEOUT:  # timeout: nothing waiting
                    self._failed("XID events", None, exc)
                break
            if not int(getattr(event, "eventType", 0)) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            code = int(getattr(event, "eventData", 0))
            index = self._index_of(getattr(event, "device", None))
            if index is None:
                log.error("XID %d on a GPU NVML cannot name", code)
                continue
            xids.setdefault(index, []).append(code)
        return xids

    def _index_of(self, device) -> int | None:
        index = self._read("index of an event's GPU", None, self._nvml.nvmlDeviceGetIndex, device)
        if index is not None:
            return int(index)
        for known in self._handles.values():
            if known.gpu is device or known.gpu == device:
                return known.nvml_index
        return None

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._event_set is not None:
            self._read("XID events (free)", None, self._nvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.warning("nvmlShutdown failed: %s", exc)
