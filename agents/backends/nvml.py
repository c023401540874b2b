"""The real GPU backend: NVIDIA's management library through ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported inside functions so this module imports on machines without it (the
control plane, CI, laptops); only constructing :class:`NvmlBackend` needs the library.

Degrade, never die: every NVML call goes through :meth:`NvmlBackend._read`, which turns any
failure (``NVMLError`` including NOT_SUPPORTED on a GPU model, or a pynvml too old to have the
function) into ``None``, "unknown" on the wire, and logs each distinct failure once. A GPU whose
name or UUID cannot be read is still reported, with a placeholder; one whose memory cannot be
read is left out of the inventory, because the scheduler would pack against a made-up number.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Mapping

from agents.backends.base import BackendSample, BackendUnavailable, JobProcesses
from agents import protocol
from agents.backends.pids import PidOwners
from agents.protocol import GpuInfo, GpuLink, GpuSample, JobGpuSample

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# NVML ABI values (nvml.h). pynvml exports the same numbers under these names; spelling them out
# here keeps this module working with old or partial bindings.
NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
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

_BUS_ID_RE = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)")


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
        self._handles: dict[int, Any] = {}
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
        handles = {}
        for index in range(count):
            read = self._read_gpu(index)
            if read is not None:
                gpus.append(read[0])
                handles[index] = read[1]
        self._handles = handles
        return gpus

    def _read_gpu(self, index: int) -> tuple[GpuInfo, Any] | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        except Exception as exc:
            log.warning("GPU %d left out of the inventory: cannot read its memory: %s", index, exc)
            return None
        if memory_mib <= 0:
            log.warning("GPU %d left out of the inventory: NVML reports %d MiB", index, memory_mib)
            return None
        uuid = self._read("UUID", index, nvml.nvmlDeviceGetUUID, handle)
        model = self._read("name", index, nvml.nvmlDeviceGetName, handle)
        info = GpuInfo(
            index=index,
            # Unique per node at least, so the control plane can still tell the GPUs apart.
            uuid=(_text(uuid)[:128] if uuid is not None else "") or f"GPU-unknown-{self._node}-{index}",
            model=(_text(model)[:64] if model is not None else "") or "unknown",
            memory_mib=memory_mib,
        )
        return info, handle

    def _devices(self) -> dict[int, Any]:
        if not self._handles:
            self.inventory()
        return self._handles

    # ------------------------------------------------------------------ topology

    def topology(self) -> list[GpuLink]:
        """Every pair of GPUs: NVLink when an active link joins them (directly or through
        NVSwitch), else the PCIe level of their common ancestor. Read once; it does not change."""
        if self._topology is not None:
            return list(self._topology)
        nvml = self._nvml
        devices = self._devices()
        direct, switched = self._nvlinks(devices)
        links = []
        indices = sorted(devices)
        for position, a in enumerate(indices):
            for b in indices[position + 1:]:
                count = direct.get((a, b), 0) or min(switched.get(a, 0), switched.get(b, 0))
                if count:
                    links.append(GpuLink(a=a, b=b, kind="nvlink", bandwidth_gbps=count * NVLINK_GBPS_PER_LINK))
                    continue
                level = self._read(
                    "topology", a, nvml.nvmlDeviceGetTopologyCommonAncestor, devices[a], devices[b]
                )
                kind = TOPOLOGY_KINDS.get(int(level), "unknown") if level is not None else "unknown"
                links.append(GpuLink(a=a, b=b, kind=kind))
        self._topology = links
        return list(links)

    def _nvlinks(self, devices: dict[int, Any]) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
        """Active NVLinks: per GPU pair (a < b) joined directly, and per GPU into an NVSwitch.

        A link whose far end is not one of this node's GPUs is counted as going into a switch
        (NVSwitch systems; on IBM POWER it could be the CPU's NPU, which we do not tell apart).
        """
        nvml = self._nvml
        by_bus = {}
        for index, handle in devices.items():
            key = _bus_key(self._read("PCI info", index, nvml.nvmlDeviceGetPciInfo, handle))
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
                remote = _bus_key(self._read("NVLink peer", index, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link))
                if remote is None:
                    continue
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
        for index, handle in devices.items():
            gpus.append(self._gpu_sample(index, handle, xids.get(index, [])))
            processes = self._processes(index, handle)
            if processes is None:
                continue  # unknown: neither per-job nor unattributed figures for this GPU
            util = self._process_util(index, handle)
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
        temperature = self._read("temperature", index, nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU)
        power_mw = self._read("power", index, nvml.nvmlDeviceGetPowerUsage, handle)
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
        return GpuSample(
            index=index,
            util_sm=_percent(getattr(rates, "gpu", None)),
            util_mem=_percent(getattr(rates, "memory", None)),
            mem_used_mib=_count(getattr(memory, "used", None), MIB, protocol.MEMORY_MIB_MAX),
            mem_total_mib=_count(getattr(memory, "total", None), MIB, protocol.MEMORY_MIB_MAX),
            temperature_c=_number(temperature, protocol.TEMPERATURE_C_MIN, protocol.TEMPERATURE_C_MAX),
            power_w=None if _number(power_mw, 0, protocol.POWER_W_MAX * 1000) is None else round(power_mw / 1000.0, 1),
            sm_clock_mhz=_count(sm_clock, high=protocol.CLOCK_MHZ_MAX),
            mem_clock_mhz=_count(mem_clock, high=protocol.CLOCK_MHZ_MAX),
            ecc_uncorrected=_count(ecc),
            xid_events=xids[:64],
        )

    def _processes(self, index: int, handle) -> dict[int, int | None] | None:
        """pid -> GPU memory in MiB (``None`` when NVML hides it); ``None`` if neither list reads."""
        nvml = self._nvml
        compute = self._read("compute processes", index, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        graphics = self._read("graphics processes", index, nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
        if compute is None and graphics is None:
            return None
        processes: dict[int, int | None] = {}
        for process in list(compute or []) + list(graphics or []):
            pid = getattr(process, "pid", None)
            if not isinstance(pid, int) or pid <= 0:
                continue
            used = getattr(process, "usedGpuMemory", None)
            memory_mib = _count(used, MIB, protocol.MEMORY_MIB_MAX)
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
            value = _percent(getattr(sample, "smUtil", None))
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
        for index, handle in self._devices().items():
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
        """XID codes per GPU index since the previous call, without blocking (timeout 0)."""
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
        for known, handle in self._handles.items():
            if handle is device or handle == device:
                return known
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


def _number(value, low: float = float("-inf"), high: float = float("inf")) -> float | None:
    """A finite reading within ``[low, high]``, else ``None``: a broken sensor's 0xFFFFFFFF is
    "unknown", not a value the wire schema would refuse along with the node's whole sample."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None


def _percent(value) -> float | None:
    number = _number(value)
    return None if number is None else min(100.0, max(0.0, number))


def _count(value, unit: int = 1, high: int = protocol.COUNTER_MAX) -> int | None:
    """A non-negative integer reading in ``unit``s up to ``high``, or ``None`` (missing, NVML's
    "not available", out of range)."""
    number = _number(value)
    if number is None or number < 0 or number >= 2**63:
        return None
    count = int(number) // unit
    return count if count <= high else None


def _bus_key(pci) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI info struct; busId spellings differ in domain width."""
    if pci is None:
        return None
    for field in ("busId", "busIdLegacy"):
        text = getattr(pci, field, None)
        match = _BUS_ID_RE.search(_text(text)) if text else None
        if match:
            return int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16)
    try:
        return int(pci.domain), int(pci.bus), int(pci.device)
    except (AttributeError, TypeError, ValueError):
        return None
