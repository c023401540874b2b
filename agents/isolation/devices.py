"""The device fence: a job may open only its own GPUs' device nodes, whatever its environment says.

``CUDA_VISIBLE_DEVICES`` is a hint to the CUDA runtime; a job that unsets it opens every
``/dev/nvidia<N>`` its account may. The fence is a BPF device filter (:mod:`.bpf`) on the job's
cgroup that, for NVIDIA's character devices, allows only:

- ``/dev/nvidia<N>`` of the job's GPUs (the driver's *device minor*, read from
  ``/proc/driver/nvidia/gpus/*/information`` by UUID: it need not equal the NVML index), or of the
  GPU a MIG instance of the job lives on;
- ``nvidiactl`` (195:255) and ``nvidia-modeset`` (195:254), which every CUDA process opens;
- ``nvidia-uvm`` and ``nvidia-uvm-tools`` (the whole ``nvidia-uvm`` major);
- the MIG capability files (``/dev/nvidia-caps/nvidia-cap<M>``) of the job's own MIG instances
  (``gpu<minor>/gi<G>/access`` and ``gpu<minor>/gi<G>/ci<C>/access`` in
  ``/proc/driver/nvidia-caps/mig-minors``); the ``mig/config`` and ``mig/monitor`` capabilities
  and other instances' files are denied.

Every other device (``/dev/null``, ttys, InfiniBand, ``nvidia-nvswitch``) keeps the access it had.
Majors come from ``/proc/devices``; NVIDIA's GPU major is 195 whether or not the driver is loaded.
A node where the filter cannot be attached (no cgroup v2 for jobs, BPF refused) is *unfenced* and
says why (:class:`DeviceFence` ``.why_not``); a launch there is not refused, since nothing that the
node advertised is broken, but the agent reports the node unfenced.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agents.isolation.bpf import BpfError, DeviceRule, attach_device_filter

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
PROC = Path("/proc")


@dataclass(frozen=True)
class JobDevices:
    """What one job may open: the device minors of its GPUs and the MIG capability minors."""

    gpu_minors: frozenset[int]
    cap_minors: frozenset[int] = frozenset()


def nvidia_majors(proc: Path = PROC) -> dict[str, int]:
    """NVIDIA's character majors by name: ``nvidia`` (always 195), and ``nvidia-uvm`` and
    ``nvidia-caps`` where their modules registered one (dynamic majors)."""
    majors = {"nvidia": NVIDIA_MAJOR}
    try:
        text = (proc / "devices").read_text()
    except OSError:
        return majors
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.startswith("Character")
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit() and parts[1] in ("nvidia-uvm", "nvidia-caps"):
            majors[parts[1]] = int(parts[0])
    return majors


def gpu_minors_by_uuid(proc: Path = PROC) -> dict[str, int]:
    """GPU UUID -> the driver's device minor (``/dev/nvidia<minor>``), from the driver's procfs."""
    minors = {}
    for info in sorted((proc / "driver" / "nvidia" / "gpus").glob("*/information")):
        try:
            text = info.read_text()
        except OSError:
            continue
        uuid = re.search(r"^GPU UUID:\s*(\S+)", text, re.M)
        minor = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
        if uuid and minor:
            minors[uuid.group(1)] = int(minor.group(1))
    return minors


def mig_cap_minors(proc: Path = PROC) -> dict[str, int]:
    """``gpu0/gi1/access`` -> the minor of its ``/dev/nvidia-caps/nvidia-cap<M>``."""
    minors = {}
    try:
        lines = (proc / "driver" / "nvidia-caps" / "mig-minors").read_text().splitlines()
    except OSError:
        return minors
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def nvml_mig_lookup(nvml: Any) -> Callable[[Any], tuple[int, int, int] | None]:
    """A lookup of a MIG instance (``GpuInfo``) -> (device minor of the GPU it lives on, GPU
    instance id, compute instance id), through NVML."""
    def lookup(gpu) -> tuple[int, int, int] | None:
        try:
            parent = nvml.nvmlDeviceGetHandleByIndex(gpu.parent_index)
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
            return (int(nvml.nvmlDeviceGetMinorNumber(parent)), int(nvml.nvmlDeviceGetGpuInstanceId(handle)),
                    int(nvml.nvmlDeviceGetComputeInstanceId(handle)))
        except Exception:  # pynvml's errors, or a binding without the functions
            return None
    return lookup


class DeviceFence:
    """Attaches each job's device filter. ``available`` False (``why_not`` says why) on a node
    where filters cannot be attached; ``proc`` and ``attach`` are the seams the tests use."""

    def __init__(self, *, proc: Path = PROC, mig_lookup: Callable[[Any], tuple[int, int, int] | None] | None = None,
                 attach: Callable[[Path, list[DeviceRule]], None] = attach_device_filter):
        self.proc = Path(proc)
        self.mig_lookup = mig_lookup or (lambda gpu: None)
        self._attach = attach
        self.available = False
        self.why_not = "not probed"

    def probe(self, scratch_cgroup: Path) -> bool:
        """Whether a filter can be attached here: tried on ``scratch_cgroup`` (an empty cgroup
        removed afterwards by the caller)."""
        try:
            self._attach(scratch_cgroup, self.rules(JobDevices(frozenset())))
        except OSError as exc:
            self.available, self.why_not = False, f"the kernel refused a BPF device filter: {exc.strerror or exc}"
            return False
        self.available, self.why_not = True, ""
        return True

    def rules(self, devices: JobDevices) -> list[DeviceRule]:
        majors = nvidia_majors(self.proc)
        rules = [DeviceRule(majors["nvidia"], frozenset(devices.gpu_minors) | {NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR})]
        if "nvidia-caps" in majors:
            rules.append(DeviceRule(majors["nvidia-caps"], frozenset(devices.cap_minors)))
        # nvidia-uvm (minor 0) and nvidia-uvm-tools (1) are every CUDA process's: not fenced.
        return rules

    def job_devices(self, gpus: list) -> JobDevices:
        """The devices of the job's GPUs (``GpuInfo``). Raises LookupError for a GPU whose device
        minor cannot be told while the driver lists GPUs: the fence would cut the job off its own."""
        by_uuid = gpu_minors_by_uuid(self.proc)
        caps = mig_cap_minors(self.proc) if any(gpu.mig_profile for gpu in gpus) else {}
        gpu_minors, cap_minors = set(), set()
        for gpu in gpus:
            if gpu.mig_profile is not None:
                found = self.mig_lookup(gpu)
                if found is None:
                    raise LookupError(f"the GPU and compute instance of MIG device {gpu.uuid} are unknown")
                minor, gi, ci = found
                for name in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
                    if name not in caps:
                        raise LookupError(f"{name} is not in {self.proc / 'driver/nvidia-caps/mig-minors'}")
                    cap_minors.add(caps[name])
            elif gpu.uuid in by_uuid:
                minor = by_uuid[gpu.uuid]
            elif not by_uuid:
                minor = gpu.index  # no NVIDIA driver here (a simulated node): NVML's order
            else:
                raise LookupError(f"GPU {gpu.index} ({gpu.uuid}) is not among the driver's GPUs in "
                                  f"{self.proc / 'driver/nvidia/gpus'}")
            gpu_minors.add(minor)
        return JobDevices(frozenset(gpu_minors), frozenset(cap_minors))

    def attach(self, cgroup: Path, devices: JobDevices) -> None:
        """Fence ``cgroup`` to ``devices``; BpfError/OSError when the kernel refuses."""
        self._attach(cgroup, self.rules(devices))


__all__ = ["BpfError", "DeviceFence", "JobDevices", "nvidia_majors", "gpu_minors_by_uuid", "mig_cap_minors"]
