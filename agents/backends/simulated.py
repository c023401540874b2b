"""A GPU backend for machines without GPUs: an inventory described by a spec string, and readings
made up from each running job's synthetic workload (:mod:`agents.backends.workloads`).

``8xA100-80GB`` is eight A100s with 80 GB each; ``4xV100-32GB,4xT4-16GB`` puts two groups on one
node with consecutive indices (0-3 V100, 4-7 T4). UUIDs are deterministic per node and index so
that a restarted simulated agent is the same node to the control plane.

MIG: ``COUNTxMODEL[mig=LAYOUT]`` puts each GPU of the group in MIG mode, split as ``LAYOUT`` says:
profiles separated by commas, each optionally ``Nx`` repeated, as ``nvidia-smi mig -cgi`` takes
them. ``2xA100-80GB[mig=3x1g.10gb,2g.20gb,3g.40gb]`` is two A100s of five MIG instances each;
``4xH100-80GB,1xH100-80GB[mig=7x1g.10gb]`` four whole H100s and one split in seven. Each instance
is a device of its own (isolation ``mig``, its profile, ``parent_index`` the GPU's place on the
node, a ``MIG-sim-...`` UUID) with the memory the driver reports for that profile, numbered after
the devices before it, as the NVML backend numbers them. A100 (40 and 80 GB) and H100 (80 GB)
offer MIG; a layout must fit the GPU's seven compute and eight memory slices, with at most one
``+me`` instance (a simplification of NVIDIA's placement rules, which also fix where each profile
may start). Instances report their own utilisation and power (their share of the board's), as a
node with DCGM would; the NVML backend reports those unknown per instance.

Co-located jobs add up: memory sums, utilisation sums (each job's share scaled by its duty cycle)
capped at 100%. A job's profile advances with its *progress* time, wall time scaled by its duty
cycle, so a throttled job iterates slower and a suspended one stands still. When a GPU's memory
would exceed its capacity (or a job its ``gpu_memory_limit_mib``), the job that overflowed it is
reported out of memory: among the jobs whose memory grew since the previous sample, the one
started last (else simply the one started last). A MIG instance is a GPU of its own here: only
jobs on that instance count against its memory. Everything is a function of the seed and the
clock readings, so tests drive it with a fake clock.

That killing is this backend's isolation: a job past its memory limit, or the one that overflowed
a shared GPU, is the one reported out of memory and killed by the agent, never its neighbour; so
whole GPUs say ``memory_limit`` (:attr:`SimulatedBackend.native_isolation`), as a driver enforcing
per-job limits would.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from agents.backends.base import BackendSample, JobProcesses, OutOfMemory
from agents.backends.workloads import WORKLOAD_ENV, Workload, noise, parse_workload
from agents.protocol import GpuInfo, GpuLink, GpuSample, JobGpuSample

log = logging.getLogger(__name__)

# Total memory in MiB as the driver reports it (nvidia-smi "memory.total"), which is a little
# below the marketing size for some boards; the scheduler packs against these numbers.
GPU_CATALOG: dict[str, int] = {
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "H100-80GB": 81559,
    "V100-32GB": 32768,
    "V100-16GB": 16384,
    "T4-16GB": 15360,
    "A10-24GB": 23028,
    "L4-24GB": 23034,
}


@dataclass(frozen=True)
class _Traits:
    idle_w: float
    max_w: float
    sm_clock_idle: int
    sm_clock_max: int
    mem_clock: int
    #: NVLinks per GPU as in the usual server (SXM boards); 0 for PCIe-only cards.
    nvlinks: int


_TRAITS: dict[str, _Traits] = {
    "A100-80GB": _Traits(55, 400, 210, 1410, 1593, 12),
    "A100-40GB": _Traits(50, 400, 210, 1410, 1215, 12),
    "H100-80GB": _Traits(70, 700, 345, 1980, 2619, 18),
    "V100-32GB": _Traits(40, 300, 135, 1530, 877, 6),
    "V100-16GB": _Traits(40, 300, 135, 1530, 877, 6),
    "T4-16GB": _Traits(10, 70, 300, 1590, 5001, 0),
    "A10-24GB": _Traits(20, 150, 210, 1695, 6251, 0),
    "L4-24GB": _Traits(16, 72, 210, 2040, 6251, 0),
}

#: Per link and direction for NVLink 2-4 (V100, A100, H100), in Gbit/s (25 GB/s).
NVLINK_GBPS_PER_LINK = 200.0
AMBIENT_C = 30.0

#: MIG profiles per model: (compute slices, memory slices, MiB the driver reports for an instance,
#: as ``nvidia-smi mig -lgip`` lists it, rounded). Each GPU has 7 compute and 8 memory slices.
MIG_PROFILES: dict[str, dict[str, tuple[int, int, int]]] = {
    "A100-40GB": {
        "1g.5gb": (1, 1, 4864), "1g.5gb+me": (1, 1, 4864), "1g.10gb": (1, 2, 9856), "2g.10gb": (2, 2, 9856),
        "3g.20gb": (3, 4, 19968), "4g.20gb": (4, 4, 19968), "7g.40gb": (7, 8, 40192),
    },
    "A100-80GB": {
        "1g.10gb": (1, 1, 9728), "1g.10gb+me": (1, 1, 9728), "1g.20gb": (1, 2, 19968), "2g.20gb": (2, 2, 19968),
        "3g.40gb": (3, 4, 40192), "4g.40gb": (4, 4, 40192), "7g.80gb": (7, 8, 81152),
    },
    "H100-80GB": {
        "1g.10gb": (1, 1, 9984), "1g.10gb+me": (1, 1, 9984), "1g.20gb": (1, 2, 20096), "2g.20gb": (2, 2, 20096),
        "3g.40gb": (3, 4, 40448), "4g.40gb": (4, 4, 40448), "7g.80gb": (7, 8, 80896),
    },
}
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8

# NVML numbers at most 64 GPUs per node and GpuInfo.index enforces the same bound.
MAX_GPUS = 64

_GROUP_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*([^\s\[\]]+)\s*(?:\[\s*mig\s*=([^\]]*)\])?\s*$", re.IGNORECASE)
_GROUP_SEPARATOR_RE = re.compile(r",(?![^\[]*\])")  # commas outside a [mig=...] layout
_LAYOUT_ITEM_RE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\S+?)\s*$")
_CATALOG_BY_UPPER = {model.upper(): model for model in GPU_CATALOG}
_SPEC_EXAMPLES = "e.g. '8xA100-80GB', '4xV100-32GB,4xT4-16GB' or '2xA100-80GB[mig=3x1g.10gb,2g.20gb,3g.40gb]'"


@dataclass(frozen=True)
class SimulatedGpu:
    """One physical GPU of a spec; ``mig`` is its MIG layout (profiles), ``None`` when it is whole."""

    model: str
    memory_mib: int
    mig: tuple[str, ...] | None = None


def parse_gpus(spec: str) -> list[SimulatedGpu]:
    """``"1xA100-80GB[mig=2x3g.40gb],1xT4-16GB"`` -> the node's physical GPUs, in order.

    Raises ``ValueError`` with a message fit for a command-line error.
    """
    if not spec or not spec.strip():
        raise ValueError(f"empty GPU spec; expected {_SPEC_EXAMPLES}")
    gpus: list[SimulatedGpu] = []
    devices = 0
    for group in _GROUP_SEPARATOR_RE.split(spec):
        match = _GROUP_RE.match(group)
        if not match:
            raise ValueError(
                f"bad GPU group {group.strip()!r}; expected COUNTxMODEL or COUNTxMODEL[mig=LAYOUT], {_SPEC_EXAMPLES}"
            )
        count, name, layout = int(match.group(1)), match.group(2), match.group(3)
        model = _CATALOG_BY_UPPER.get(name.upper())
        if model is None:
            raise ValueError(f"unknown GPU model {name!r}; known models: {', '.join(GPU_CATALOG)}")
        if count < 1:
            raise ValueError(f"GPU group {group.strip()!r} must have at least one GPU")
        mig = None if layout is None else _parse_layout(model, layout)
        gpus.extend([SimulatedGpu(model, GPU_CATALOG[model], mig)] * count)
        devices += count * (1 if mig is None else len(mig))
        if devices > MAX_GPUS or len(gpus) > MAX_GPUS:
            raise ValueError(f"spec {spec!r} describes more than {MAX_GPUS} GPUs (MIG instances count as GPUs)")
    return gpus


def _parse_layout(model: str, layout: str) -> tuple[str, ...]:
    """``"3x1g.10gb,2g.20gb"`` -> ``("1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb")``, checked to fit."""
    offered = MIG_PROFILES.get(model)
    if offered is None:
        raise ValueError(f"{model} does not support MIG; MIG models: {', '.join(MIG_PROFILES)}")
    if not layout.strip():
        raise ValueError(f"empty MIG layout for {model}; expected profiles, e.g. [mig=3x1g.10gb,2g.20gb]")
    profiles: list[str] = []
    for item in layout.split(","):
        match = _LAYOUT_ITEM_RE.match(item)
        profile = match.group(2).lower() if match else ""
        if profile not in offered:
            raise ValueError(f"unknown MIG profile {item.strip()!r} for {model}; its profiles: {', '.join(offered)}")
        count = int(match.group(1) or 1)
        if count < 1:
            raise ValueError(f"MIG layout item {item.strip()!r} must have at least one instance")
        profiles.extend([profile] * count)
    compute = sum(offered[profile][0] for profile in profiles)
    memory = sum(offered[profile][1] for profile in profiles)
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise ValueError(
            f"MIG layout {layout.strip()!r} does not fit one {model}: it needs {compute} of "
            f"{MIG_COMPUTE_SLICES} compute slices and {memory} of {MIG_MEMORY_SLICES} memory slices"
        )
    if sum(profile.endswith("+me") for profile in profiles) > 1:
        raise ValueError(f"MIG layout {layout.strip()!r}: at most one instance per GPU has the media engines (+me)")
    return tuple(profiles)


def parse_spec(spec: str) -> list[tuple[str, int]]:
    """``"2xT4-16GB,1xA10-24GB"`` -> ``[("T4-16GB", 15360), ("T4-16GB", 15360), ("A10-24GB", 23028)]``:
    the physical GPUs (a MIG GPU once, however it is split). See :func:`parse_gpus`."""
    return [(gpu.model, gpu.memory_mib) for gpu in parse_gpus(spec)]


@dataclass
class _SimulatedJob:
    workload: Workload
    started: int  # order of first sight: a larger number started later
    last_seen: float  # clock reading of the previous sample
    progress: float = 0.0  # seconds of work done: wall time scaled by the duty cycle
    memory_mib: int = 0  # per GPU at the previous sample
    out_of_memory: bool = False


@dataclass
class _Reading:
    job: JobProcesses
    state: _SimulatedJob
    memory_mib: int
    util: float
    grew: bool
    gpus: list[int] = field(default_factory=list)


class SimulatedBackend:
    """The GPUs a spec describes, busy with whatever the running jobs' workloads say."""

    name = "simulated"
    #: What this backend enforces on a whole GPU by itself: memory, by reporting the overflowing
    #: job out of memory (the agent kills it). MIG instances say ``mig`` instead.
    native_isolation = "memory_limit"

    def __init__(self, spec: str, node: str, *, seed: int = 0, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.seed = seed
        self._clock = clock
        self._gpus: list[GpuInfo] = []
        self._board: dict[int, int] = {}  # device index -> the physical GPU it is or lives on
        self._share: dict[int, float] = {}  # device index -> its share of its board's compute
        for board, gpu in enumerate(parse_gpus(spec)):
            if gpu.mig is None:
                self._add(board, GpuInfo(index=len(self._gpus), uuid=f"GPU-sim-{node}-{board}", model=gpu.model,
                                         memory_mib=gpu.memory_mib, isolation=self.native_isolation), 1.0)
                continue
            for slot, profile in enumerate(gpu.mig):
                compute, _memory, memory_mib = MIG_PROFILES[gpu.model][profile]
                instance = GpuInfo(index=len(self._gpus), uuid=f"MIG-sim-{node}-{board}-{slot}", model=gpu.model,
                                   memory_mib=memory_mib, isolation="mig", mig_profile=profile, parent_index=board)
                self._add(board, instance, compute / MIG_COMPUTE_SLICES)
        self._jobs: dict[int, _SimulatedJob] = {}
        self._started = 0
        self._xids: dict[int, list[int]] = {}
        self._samples = 0

    def _add(self, board: int, device: GpuInfo, share: float) -> None:
        self._gpus.append(device)
        self._board[device.index] = board
        self._share[device.index] = share

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def topology(self) -> list[GpuLink]:
        """A typical server of each model: SXM boards on NVLink, PCIe cards behind switches.

        NVLink models are fully connected through NVSwitch (A100/H100) or within each group of
        four (V100, DGX-1 style); PCIe cards share a switch in pairs and a host bridge in fours.
        Different models on one node only meet through the system interconnect. Instances of one
        MIG GPU share a board; MIG has no peer-to-peer, so a MIG GPU meets others over PCIe only.
        """
        links = []
        for a in self._gpus:
            for b in self._gpus:
                if a.index >= b.index:
                    continue
                links.append(self._link(a, b))
        return links

    def _link(self, a: GpuInfo, b: GpuInfo) -> GpuLink:
        board_a, board_b = self._board[a.index], self._board[b.index]
        if board_a == board_b:
            return GpuLink(a=a.index, b=b.index, kind="same_board")
        if a.model != b.model:
            return GpuLink(a=a.index, b=b.index, kind="system")
        same_quad = board_a // 4 == board_b // 4
        nvlinks = 0 if self._is_mig(a.index) or self._is_mig(b.index) else _TRAITS[a.model].nvlinks
        if nvlinks and not a.model.startswith("V100"):  # NVSwitch: every pair, all links
            return GpuLink(a=a.index, b=b.index, kind="nvlink", bandwidth_gbps=nvlinks * NVLINK_GBPS_PER_LINK)
        if nvlinks:  # hybrid cube mesh: simplified to two links inside each group of four
            if same_quad:
                return GpuLink(a=a.index, b=b.index, kind="nvlink", bandwidth_gbps=2 * NVLINK_GBPS_PER_LINK)
            return GpuLink(a=a.index, b=b.index, kind="system")
        if board_a // 2 == board_b // 2:
            return GpuLink(a=a.index, b=b.index, kind="pcie_switch")
        if same_quad:
            return GpuLink(a=a.index, b=b.index, kind="pcie_host_bridge")
        return GpuLink(a=a.index, b=b.index, kind="system")

    def inject_xid(self, gpu_index: int, code: int) -> None:
        """Make the next sample report XID ``code`` on ``gpu_index`` (demos, alert tests); on a
        MIG instance, on every instance of its GPU, as NVML reports an XID for the whole GPU."""
        board = self._board.get(gpu_index)
        for index in [i for i, b in self._board.items() if b == board] or [gpu_index]:
            self._xids.setdefault(index, []).append(code)

    # ------------------------------------------------------------------ sampling

    def sample(self, jobs: Mapping[int, JobProcesses]) -> BackendSample:
        now = self._clock()
        self._samples += 1
        for job_id in list(self._jobs):
            if job_id not in jobs:
                del self._jobs[job_id]

        capacity = {gpu.index: gpu.memory_mib for gpu in self._gpus}
        readings: list[_Reading] = []
        for job in jobs.values():
            state = self._state(job, now)
            if state.out_of_memory:
                continue  # killed: its memory is freed, it computes nothing
            duty = min(1.0, max(0.0, job.duty_cycle))
            state.progress += max(0.0, now - state.last_seen) * duty
            state.last_seen = now
            memory = state.workload.memory_mib(state.progress)
            util = state.workload.util_percent(state.progress, self.seed, job.job_id) * duty
            gpus = [index for index in dict.fromkeys(job.gpu_indices) if index in capacity]
            if gpus:
                readings.append(_Reading(job, state, memory, util, memory > state.memory_mib, gpus))

        out_of_memory = self._out_of_memory(readings, capacity)
        for reading in readings:
            reading.state.memory_mib = reading.memory_mib
        alive = [reading for reading in readings if not reading.state.out_of_memory]

        job_samples = []
        used = {index: 0 for index in capacity}
        busy = {index: 0.0 for index in capacity}
        for reading in alive:
            for index in reading.gpus:
                used[index] += reading.memory_mib
                busy[index] += reading.util
                job_samples.append(
                    JobGpuSample(
                        job_id=reading.job.job_id,
                        gpu_index=index,
                        mem_used_mib=reading.memory_mib,
                        util_sm=round(min(100.0, reading.util), 1),
                    )
                )
        util = {index: min(100.0, value) for index, value in busy.items()}
        board_load: dict[int, float] = {}  # per physical GPU, 0..1: its devices' load by compute share
        for index, board in self._board.items():
            board_load[board] = board_load.get(board, 0.0) + util[index] / 100.0 * self._share[index]
        gpus = [
            self._gpu_sample(gpu, used[gpu.index], util[gpu.index], board_load[self._board[gpu.index]])
            for gpu in self._gpus
        ]
        return BackendSample(gpus=gpus, jobs=job_samples, unattributed_mib={}, out_of_memory=out_of_memory)

    def _state(self, job: JobProcesses, now: float) -> _SimulatedJob:
        state = self._jobs.get(job.job_id)
        if state is None:
            spec = job.env.get(WORKLOAD_ENV)
            try:
                workload = parse_workload(spec, job.gpu_memory_limit_mib)
            except ValueError as exc:
                log.warning("job %d: bad %s=%r (%s); simulating the default workload",
                            job.job_id, WORKLOAD_ENV, spec, exc)
                workload = parse_workload(None, job.gpu_memory_limit_mib)
            self._started += 1
            state = self._jobs[job.job_id] = _SimulatedJob(workload, started=self._started, last_seen=now)
        return state

    def _out_of_memory(self, readings: list[_Reading], capacity: dict[int, int]) -> list[OutOfMemory]:
        found: list[OutOfMemory] = []

        def kill(reading: _Reading, gpu_index: int, error: str) -> None:
            reading.state.out_of_memory = True
            found.append(OutOfMemory(reading.job.job_id, gpu_index, error))

        for reading in readings:
            limit = reading.job.gpu_memory_limit_mib
            if limit is not None and reading.memory_mib > limit:
                kill(
                    reading,
                    reading.gpus[0],
                    f"CUDA out of memory (simulated) on {self._name(reading.gpus[0])}: job {reading.job.job_id} "
                    f"needs {reading.memory_mib} MiB, over its limit of {limit} MiB",
                )
        for index, total in capacity.items():
            while True:
                resident = [r for r in readings if index in r.gpus and not r.state.out_of_memory]
                used = sum(r.memory_mib for r in resident)
                if used <= total:
                    break
                growing = [r for r in resident if r.grew] or resident
                victim = max(growing, key=lambda r: r.state.started)
                others = used - victim.memory_mib
                kill(
                    victim,
                    index,
                    f"CUDA out of memory (simulated) on {self._name(index)}: job {victim.job.job_id} needs "
                    f"{victim.memory_mib} MiB; the {'instance' if self._is_mig(index) else 'GPU'} has "
                    f"{total} MiB of which {others} MiB are held by other jobs",
                )
        for oom in found:
            log.info("job %d ran out of memory: %s", oom.job_id, oom.error)
        return found

    def _is_mig(self, index: int) -> bool:
        return self._gpus[index].isolation == "mig"

    def _name(self, index: int) -> str:
        """How an error names a device: "GPU 3", or "MIG instance 3 (1g.10gb on GPU 0)"."""
        gpu = self._gpus[index]
        if gpu.isolation != "mig":
            return f"GPU {index}"
        return f"MIG instance {index} ({gpu.mig_profile} on GPU {gpu.parent_index})"

    def _gpu_sample(self, gpu: GpuInfo, used_mib: int, util: float, board_load: float) -> GpuSample:
        """Utilisation and memory are the device's own; temperature and clocks the board's (one
        die, one clock); power the device's share of the board's, so that instances add up."""
        traits = _TRAITS[gpu.model]
        share = self._share[gpu.index]
        load = util / 100.0
        wobble = noise(self.seed, -1 - gpu.index, self._samples)  # sensors are never perfectly still
        return GpuSample(
            index=gpu.index,
            util_sm=round(util, 1),
            util_mem=round(util * 0.55, 1),
            mem_used_mib=min(used_mib, gpu.memory_mib),
            mem_total_mib=gpu.memory_mib,
            temperature_c=round(AMBIENT_C + 45.0 * board_load + 0.5 * wobble, 1),
            power_w=round(max(0.0, (traits.idle_w + (traits.max_w - traits.idle_w) * load + wobble) * share), 1),
            sm_clock_mhz=traits.sm_clock_max if board_load > 0 else traits.sm_clock_idle,
            mem_clock_mhz=traits.mem_clock,
            ecc_uncorrected=0,
            xid_events=self._xids.pop(gpu.index, [])[:64],
        )

    def close(self) -> None:
        pass
