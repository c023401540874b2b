"""A GPU backend for machines without GPUs: an inventory described by a spec string, and readings
made up from each running job's synthetic workload (:mod:`agents.backends.workloads`).

``8xA100-80GB`` is eight A100s with 80 GB each; ``4xV100-32GB,4xT4-16GB`` puts two groups on one
node with consecutive indices (0-3 V100, 4-7 T4). UUIDs are deterministic per node and index so
that a restarted simulated agent is the same node to the control plane.

Co-located jobs add up: memory sums, utilisation sums (each job's share scaled by its duty cycle)
capped at 100%. A job's profile advances with its *progress* time, wall time scaled by its duty
cycle, so a throttled job iterates slower and a suspended one stands still. When a GPU's memory
would exceed its capacity (or a job its ``gpu_memory_limit_mib``), the job that overflowed it is
reported out of memory: among the jobs whose memory grew since the previous sample, the one
started last (else simply the one started last). Everything is a function of the seed and the
clock readings, so tests drive it with a fake clock.
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

# NVML numbers at most 64 GPUs per node and GpuInfo.index enforces the same bound.
MAX_GPUS = 64

_GROUP_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")
_CATALOG_BY_UPPER = {model.upper(): model for model in GPU_CATALOG}


def parse_spec(spec: str) -> list[tuple[str, int]]:
    """``"2xT4-16GB,1xA10-24GB"`` -> ``[("T4-16GB", 15360), ("T4-16GB", 15360), ("A10-24GB", 23028)]``.

    Raises ``ValueError`` with a message fit for a command-line error.
    """
    if not spec or not spec.strip():
        raise ValueError("empty GPU spec; expected e.g. '8xA100-80GB' or '4xV100-32GB,4xT4-16GB'")
    gpus: list[tuple[str, int]] = []
    for group in spec.split(","):
        match = _GROUP_RE.match(group)
        if not match:
            raise ValueError(f"bad GPU group {group.strip()!r}; expected COUNTxMODEL, e.g. '8xA100-80GB'")
        count, name = int(match.group(1)), match.group(2)
        model = _CATALOG_BY_UPPER.get(name.upper())
        if model is None:
            raise ValueError(f"unknown GPU model {name!r}; known models: {', '.join(GPU_CATALOG)}")
        if count < 1:
            raise ValueError(f"GPU group {group.strip()!r} must have at least one GPU")
        gpus.extend([(model, GPU_CATALOG[model])] * count)
        if len(gpus) > MAX_GPUS:
            raise ValueError(f"spec {spec!r} describes more than {MAX_GPUS} GPUs")
    return gpus


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

    def __init__(self, spec: str, node: str, *, seed: int = 0, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.seed = seed
        self._clock = clock
        self._gpus = [
            GpuInfo(index=index, uuid=f"GPU-sim-{node}-{index}", model=model, memory_mib=memory_mib)
            for index, (model, memory_mib) in enumerate(parse_spec(spec))
        ]
        self._jobs: dict[int, _SimulatedJob] = {}
        self._started = 0
        self._xids: dict[int, list[int]] = {}
        self._samples = 0

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def topology(self) -> list[GpuLink]:
        """A typical server of each model: SXM boards on NVLink, PCIe cards behind switches.

        NVLink models are fully connected through NVSwitch (A100/H100) or within each group of
        four (V100, DGX-1 style); PCIe cards share a switch in pairs and a host bridge in fours.
        Different models on one node only meet through the system interconnect.
        """
        links = []
        for a in self._gpus:
            for b in self._gpus:
                if a.index >= b.index:
                    continue
                links.append(self._link(a, b))
        return links

    def _link(self, a: GpuInfo, b: GpuInfo) -> GpuLink:
        if a.model != b.model:
            return GpuLink(a=a.index, b=b.index, kind="system")
        traits = _TRAITS[a.model]
        same_quad = a.index // 4 == b.index // 4
        if traits.nvlinks and not a.model.startswith("V100"):  # NVSwitch: every pair, all links
            return GpuLink(a=a.index, b=b.index, kind="nvlink", bandwidth_gbps=traits.nvlinks * NVLINK_GBPS_PER_LINK)
        if traits.nvlinks:  # hybrid cube mesh: simplified to two links inside each group of four
            if same_quad:
                return GpuLink(a=a.index, b=b.index, kind="nvlink", bandwidth_gbps=2 * NVLINK_GBPS_PER_LINK)
            return GpuLink(a=a.index, b=b.index, kind="system")
        if a.index // 2 == b.index // 2:
            return GpuLink(a=a.index, b=b.index, kind="pcie_switch")
        if same_quad:
            return GpuLink(a=a.index, b=b.index, kind="pcie_host_bridge")
        return GpuLink(a=a.index, b=b.index, kind="system")

    def inject_xid(self, gpu_index: int, code: int) -> None:
        """Make the next sample report XID ``code`` on ``gpu_index`` (demos, alert tests)."""
        self._xids.setdefault(gpu_index, []).append(code)

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
        gpus = [self._gpu_sample(gpu, used[gpu.index], min(100.0, busy[gpu.index])) for gpu in self._gpus]
        return BackendSample(gpus=gpus, jobs=job_samples, unattributed_mib={}, out_of_memory=out_of_memory)

    def _state(self, job: JobProcesses, now: float) -> _SimulatedJob:
        state = self._jobs.get(job.job_id)
        if state is None:
            spec = job.env.get(WORKLOAD_ENV)
            try:
                workload = parse_workload(spec, job.gpu_memory_limit_mib)
            except ValueError as exc:
                log.warning("job %d: bad %s=%r (%s); simulating the default workload", job.job_id, WORKLOAD_ENV, spec, exc)
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
                    f"CUDA out of memory (simulated) on GPU {reading.gpus[0]}: job {reading.job.job_id} "
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
                    f"CUDA out of memory (simulated) on GPU {index}: job {victim.job.job_id} needs "
                    f"{victim.memory_mib} MiB; the GPU has {total} MiB of which {others} MiB are "
                    f"held by other jobs",
                )
        for oom in found:
            log.info("job %d ran out of memory: %s", oom.job_id, oom.error)
        return found

    def _gpu_sample(self, gpu: GpuInfo, used_mib: int, util: float) -> GpuSample:
        traits = _TRAITS[gpu.model]
        load = util / 100.0
        wobble = noise(self.seed, -1 - gpu.index, self._samples)  # sensors are never perfectly still
        return GpuSample(
            index=gpu.index,
            util_sm=round(util, 1),
            util_mem=round(util * 0.55, 1),
            mem_used_mib=min(used_mib, gpu.memory_mib),
            mem_total_mib=gpu.memory_mib,
            temperature_c=round(AMBIENT_C + 45.0 * load + 0.5 * wobble, 1),
            power_w=round(max(0.0, traits.idle_w + (traits.max_w - traits.idle_w) * load + wobble), 1),
            sm_clock_mhz=traits.sm_clock_max if util > 0 else traits.sm_clock_idle,
            mem_clock_mhz=traits.mem_clock,
            ecc_uncorrected=0,
            xid_events=self._xids.pop(gpu.index, [])[:64],
        )

    def close(self) -> None:
        pass
