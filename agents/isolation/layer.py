"""What the runner and the agent ask of the isolation layer, once the modes are chosen.

:class:`IsolationLayer` holds each GPU's mode (:mod:`agents.isolation.choose` picks them) and the
machinery behind them: the per-GPU MPS daemons (:mod:`agents.isolation.mps`), the job cgroups
(:mod:`agents.isolation.cgroups`), their device fence (:mod:`agents.isolation.devices`) and the
driver's memory limits (:mod:`agents.isolation.memory_limits`). For each launch it returns a
:class:`JobFence` (the variables Colony sets after the job's own, and the cgroup the job is born
in: every job gets one where the node can make them, with its device filter and its host memory
and CPU limits) or refuses it: a GPU advertised as fenced never runs a job unfenced, and a job is
never started outside its cgroup on a node that has them. :attr:`IsolationLayer.fencing` says
what the node fences (:class:`NodeFencing`), for the agent to report. A backend that enforces a mode itself (the
simulated one) needs none of this: its GPUs are reported with its mode and fences are empty.

Memory limits, in one rule: hard = the launch's ``gpu_memory_limit_mib`` always; soft = hard for a
whole-GPU job (``compute_share`` None, which is how a guaranteed job is launched), soft 0 for a
shared one (the driver may reclaim under pressure from it first). A launch without a memory
limit gets no GPU memory limit (it still gets its cgroup). MIG instances need nothing but their ``MIG-...`` UUID in
``CUDA_VISIBLE_DEVICES`` (:meth:`IsolationLayer.cuda_visible_devices`).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from agents.isolation.cgroups import JobCgroups
from agents.isolation.devices import DeviceFence
from agents.isolation.memory_limits import DriverMemoryLimits, MemoryLimitError
from agents.isolation.mps import MPS_JOB_VARIABLES, MpsDaemons, MpsError, thread_percentage
from agents.backends.base import BackendSample
from agents.protocol import GpuInfo, LaunchJob

log = logging.getLogger(__name__)

# How often the MPS daemons are asked whether they (and their servers) still run.
MPS_CHECK_INTERVAL_S = 5.0
# What CUDA frameworks print when an allocation fails (PyTorch, the CUDA runtime and driver, XLA).
ALLOCATION_FAILURE = re.compile(
    r"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError"
    r"|RESOURCE_EXHAUSTED: Out of memory")
FENCED = ("mps", "memory_limit")
_ENFORCED_BY = {"mps": "its GPU's MPS server", "memory_limit": "the driver"}


class IsolationError(RuntimeError):
    """The launch cannot be fenced as its GPUs are advertised; the message says why."""


@dataclass(frozen=True)
class JobFence:
    """What a launch gets: ``env`` set after the job's own variables (``None``: removed, so the
    job cannot set it either), and the ``cgroup`` the job is born in; ``gpu_memory_limited``: the
    driver holds that cgroup to the job's GPU memory limit (a container a daemon starts escapes it)."""

    env: dict[str, str | None] = field(default_factory=dict)
    cgroup: Path | None = None
    gpu_memory_limited: bool = False


@dataclass(frozen=True)
class NodeFencing:
    """What fences the node's jobs, whatever the GPUs' sharing modes: a cgroup of each job's own
    (killed at its end: nothing outlives it), the device filter on it (a job opens only its own
    GPUs), host memory and CPU limits. ``reasons``: why each missing part is missing."""

    cgroups: bool = False
    devices: bool = False
    limits: bool = False
    reasons: tuple[str, ...] = ("the isolation layer was not configured",)

    @property
    def fenced(self) -> bool:
        """Jobs are contained and see only their own GPUs (limits are not required for it)."""
        return self.cgroups and self.devices

    @property
    def kinds(self) -> tuple[str, ...]:
        """The fences present, as ``NodeRegistered.job_fences`` names them ("cgroup", "devices")."""
        return tuple(kind for kind, present in (("cgroup", self.cgroups), ("devices", self.devices)) if present)

    def summary(self) -> str:
        parts = ["job cgroups" if self.cgroups else None, "device filter" if self.devices else None,
                 "memory/CPU limits" if self.limits else None]
        have = ", ".join(p for p in parts if p) or "nothing"
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return f"{'fenced' if self.fenced else 'unfenced'}: {have}{why}"


@dataclass(frozen=True)
class MpsFault:
    """The MPS service of a GPU failed: its clients (``job_ids``) are broken and must be requeued."""

    gpu_index: int
    reason: str
    job_ids: tuple[int, ...]


class IsolationLayer:
    """Per-GPU isolation of one node. ``modes``: GPU index -> mode, for the GPUs that are not MIG
    instances; ``native``: the backend enforces the modes itself. A GPU the layer was given no
    mode for (a runner built without :func:`agents.isolation.configure`) keeps the mode its backend
    reports, as the backend's own doing (:meth:`annotate`)."""

    def __init__(self, gpus: list[GpuInfo], modes: dict[int, str], *, mps: MpsDaemons | None = None,
                 cgroups: JobCgroups | None = None, limits: DriverMemoryLimits | None = None,
                 native: bool = False, mps_check_interval: float = MPS_CHECK_INTERVAL_S,
                 devices: DeviceFence | None = None, fencing: NodeFencing | None = None):
        self.gpus = {gpu.index: gpu for gpu in gpus}
        self.modes = {gpu.index: "mig" if gpu.isolation == "mig" else modes.get(gpu.index, "unfenced")
                      for gpu in gpus}
        # GPUs whose mode the backend enforces itself: nothing to do here for them.
        self._native = {gpu.index for gpu in gpus if gpu.isolation != "mig"} if native else set()
        self.mps, self.cgroups, self.limits = mps, cgroups, limits
        self.devices = devices if devices is not None and devices.available else None
        self.fencing = fencing if fencing is not None else NodeFencing(
            cgroups=cgroups is not None, devices=self.devices is not None,
            limits=bool(cgroups is not None and cgroups.controllers),
            reasons=() if cgroups is not None and self.devices is not None else
            ("no job cgroups" if cgroups is None else "no device filter",))
        self.mps_check_interval = mps_check_interval
        self._next_check = 0.0
        self._closed = False
        self._mps_clients: dict[int, int] = {}  # job id -> the GPU whose MPS daemon it talks to
        self._unreleased: set[int] = set()  # ended jobs whose cgroup was not empty yet

    @classmethod
    def unfenced(cls, gpus: list[GpuInfo] = ()) -> IsolationLayer:
        return cls(list(gpus), {})

    # ------------------------------------------------------------------ inventory

    @property
    def native(self) -> bool:
        return bool(self._native)

    def mode(self, index: int) -> str:
        return self.modes.get(index, "unfenced")

    def _enforced_here(self, index: int) -> str:
        """The mode this layer enforces on the GPU ("unfenced" where the backend does it)."""
        return "unfenced" if index in self._native else self.mode(index)

    def annotate(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        """The backend's inventory with each GPU's mode set (MIG instances stay as reported); the
        layer learns the inventory (a MIG instance's UUID) from it."""
        annotated = []
        for gpu in gpus:
            self.gpus[gpu.index] = gpu
            if gpu.isolation == "mig" or gpu.index not in self.modes:
                self.modes[gpu.index] = gpu.isolation
                if gpu.isolation != "mig":
                    self._native.add(gpu.index)
                annotated.append(gpu)
            else:
                annotated.append(gpu.model_copy(update={"isolation": self.modes[gpu.index]}))
        return annotated

    def cuda_visible_devices(self, indices) -> str:
        """``CUDA_VISIBLE_DEVICES`` for the job's GPUs: a MIG instance by its ``MIG-...`` UUID (CUDA
        numbers instances differently from NVML), a whole GPU by its index, or by its UUID on a node
        with MIG instances, where our indices count instances and are no longer CUDA's."""
        by_uuid = any(gpu.isolation == "mig" for gpu in self.gpus.values())
        return ",".join(self.gpus[i].uuid if i in self.gpus and (by_uuid or self.gpus[i].isolation == "mig")
                        else str(i) for i in indices)

    def readable(self, reading: BackendSample) -> BackendSample:
        """``reading`` with per-job utilisation that NVML gets wrong under MPS put right.

        NVML charges the SM time of every MPS client to the MPS server: each client's own
        utilisation reads 0% however hard it computes (measured on an H100, driver 580: two
        clients at 98-100% GPU utilisation both read 0). A 0 would tell the scheduler that a
        guaranteed job slowed by its neighbour is idle, and teach its profile that it needs no
        compute. So an MPS client that is its GPU's only job gets the GPU's own utilisation (what
        it is, then), and one that shares its GPU with other jobs gets "unknown": the scheduler
        then goes by the GPU's utilisation, which MPS does not distort. Jobs that are no MPS
        clients (several GPUs, or another mode) keep NVML's reading, as does every job's memory,
        which NVML reports exactly per client."""
        clients = self._mps_clients
        if not clients or not any(job.job_id in clients for job in reading.jobs):
            return reading
        per_gpu: dict[int, int] = {}
        for job in reading.jobs:
            per_gpu[job.gpu_index] = per_gpu.get(job.gpu_index, 0) + 1
        gpu_util = {gpu.index: gpu.util_sm for gpu in reading.gpus}
        jobs = []
        for job in reading.jobs:
            if clients.get(job.job_id) == job.gpu_index:
                alone = per_gpu[job.gpu_index] == 1
                job = job.model_copy(update={"util_sm": gpu_util.get(job.gpu_index) if alone else None})
            jobs.append(job)
        return replace(reading, jobs=jobs)

    # ------------------------------------------------------------------ launches

    def fence(self, cmd: LaunchJob) -> JobFence:
        """The launch's fence; IsolationError when a fenced GPU cannot fence it now."""
        indices = list(cmd.gpu_indices)
        env: dict[str, str | None] = {}
        native = bool(indices) and all(i in self._native for i in indices)
        if not native and len(indices) > 1 and cmd.compute_share is not None and any(
                self._enforced_here(i) == "mps" for i in indices):
            # MPS fences one GPU per client here; a share of several would run as a plain client.
            raise IsolationError("a job with a compute share on several MPS GPUs cannot be fenced; "
                                 "it was not started unfenced")
        if not native and any(self._enforced_here(i) == "mps" for i in indices):
            # Removed unless set below: a job on an MPS GPU must not pick its daemon or its share.
            env = {name: None for name in MPS_JOB_VARIABLES}
        if not native and len(indices) == 1 and self._enforced_here(indices[0]) == "mps":
            env.update(self._mps_env(cmd, indices[0]))
        limited = [] if native else [i for i in indices if self._enforced_here(i) == "memory_limit"]
        cgroup = self._cgroup(cmd, limited if cmd.gpu_memory_limit_mib else [])
        if not native and len(indices) == 1 and self._enforced_here(indices[0]) == "mps":
            self._mps_clients[cmd.job_id] = indices[0]
        return JobFence(env, cgroup, gpu_memory_limited=bool(limited and cmd.gpu_memory_limit_mib))

    def _cgroup(self, cmd: LaunchJob, limited: list[int]) -> Path | None:
        """The job's cgroup with its limits and device filter (None on a node without job cgroups)."""
        if self.cgroups is None:
            if limited:
                raise IsolationError("driver memory limits are not set up on this node")
            return None
        try:
            cgroup = self.cgroups.create(cmd.job_id, memory_mib=cmd.host_memory_mib, cpu_milli=cmd.cpu_milli)
        except OSError as exc:
            self.release(cmd.job_id)
            raise IsolationError(f"cannot create the job's cgroup {self.cgroups.path(cmd.job_id)}: "
                                 f"{exc.strerror or exc}; the job was not started unfenced") from None
        if self.devices is not None:
            try:
                self.devices.attach(cgroup, self.devices.job_devices(self._job_gpus(cmd.gpu_indices)))
            except (LookupError, OSError) as exc:
                self.release(cmd.job_id)
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise IsolationError(f"cannot fence the job's devices in {cgroup}: {why}; "
                                     "the job was not started unfenced") from None
        if limited:
            self._limit(cmd, limited, cgroup)
        return cgroup

    def _job_gpus(self, indices) -> list[GpuInfo]:
        missing = [i for i in indices if i not in self.gpus]
        if missing:
            raise LookupError(f"GPU {missing[0]} is not in this node's inventory")
        return [self.gpus[i] for i in indices]

    def _mps_env(self, cmd: LaunchJob, index: int) -> dict[str, str | None]:
        if self.mps is None or not self.mps.is_running(index):
            raise IsolationError(f"the MPS control daemon of GPU {index} is not running (the agent restarts it); "
                                 "the job was not started unfenced on a GPU shared through MPS")
        env: dict[str, str | None] = dict(self.mps.env_for(index))
        if cmd.gpu_memory_limit_mib:
            # Device 0: the job sees only its own GPU.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={cmd.gpu_memory_limit_mib}M"
        percentage = thread_percentage(cmd.compute_share)
        if percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percentage)
        return env

    def _limit(self, cmd: LaunchJob, indices: list[int], cgroup: Path) -> None:
        if self.limits is None:
            self.release(cmd.job_id)
            raise IsolationError("driver memory limits are not set up on this node")
        hard = cmd.gpu_memory_limit_mib
        soft = hard if cmd.compute_share is None else 0
        for index in indices:
            try:
                self.limits.set(self.gpus[index].uuid, cgroup, soft, hard)
            except MemoryLimitError as exc:
                self.release(cmd.job_id)
                raise IsolationError(f"the driver refused a memory limit of {hard} MiB on GPU {index} for "
                                     f"{cgroup}: {exc}; the job was not started unfenced") from None
        log.info("job %d: GPU memory limited to %d MiB (soft %d MiB) on GPU(s) %s in %s",
                 cmd.job_id, hard, soft, indices, cgroup)

    def freeze(self, job_id: int, frozen: bool) -> None:
        """Freeze or thaw the job's cgroup, where the node makes them (see ``JobCgroups.freeze``)."""
        if self.cgroups is not None:
            self.cgroups.freeze(job_id, frozen)

    def release(self, job_id: int) -> None:
        """The job ended (or never started): forget its MPS link, remove its cgroup (which clears
        its limits); a cgroup not yet empty is removed by a later :meth:`retry_releases`."""
        self._mps_clients.pop(job_id, None)
        if self.cgroups is None:
            return
        if self.cgroups.remove(job_id):
            self._unreleased.discard(job_id)
        else:
            self._unreleased.add(job_id)

    def adopt(self, cmd: LaunchJob) -> None:
        """A job an earlier agent started: a client of its GPU's MPS daemon as if launched here
        (its cgroup, if any, is removed by :meth:`release` when it ends)."""
        indices = list(cmd.gpu_indices)
        if len(indices) == 1 and self._enforced_here(indices[0]) == "mps":
            self._mps_clients[cmd.job_id] = indices[0]

    def retry_releases(self) -> None:
        for job_id in sorted(self._unreleased):
            self.release(job_id)

    # ------------------------------------------------------------------ faults and exits

    def mps_faults(self, now: float | None = None) -> list[MpsFault]:
        """MPS daemons and servers that failed since the last look (at most every
        ``mps_check_interval``); a daemon that is gone is restarted."""
        now = time.monotonic() if now is None else now
        if self.mps is None or now < self._next_check:
            return []
        self._next_check = now + self.mps_check_interval
        faults = []
        for index, daemon in sorted(self.mps.daemons.items()):
            clients = tuple(sorted(job for job, gpu in self._mps_clients.items() if gpu == index))
            reason = self.mps.check(index, in_use=bool(clients))
            if reason is not None:
                log.error("GPU %d: %s; requeueing its MPS jobs %s", index, reason, list(clients))
                faults.append(MpsFault(index, reason, clients))
                for job_id in clients:
                    self._mps_clients.pop(job_id, None)
            if not self.mps.is_running(index):
                self._restart(index)
        return faults

    def _restart(self, index: int) -> None:
        self.mps.stop(index)  # whatever is left of it (a daemon that stopped answering)
        try:
            self.mps.start(index, self.gpus[index].uuid)
            log.info("GPU %d: MPS control daemon restarted", index)
        except MpsError as exc:
            log.error("GPU %d: cannot restart the MPS control daemon: %s; launches there are refused "
                      "until it runs again", index, exc)

    def memory_pressure_error(self, job_id: int, output_tail: str, gpu_indices, limit_mib: int | None,
                              used_mib: dict[int, int]) -> str | None:
        """The exit's error when the job died of an allocation failure on a GPU that held it to
        ``limit_mib`` (None when it did not): which GPU, the limit, what enforced it, and the most it
        was seen holding where known (``used_mib``: GPU index -> MiB)."""
        if not limit_mib or not ALLOCATION_FAILURE.search(output_tail or ""):
            return None
        indices = list(gpu_indices)
        fenced = [i for i in indices if self._enforced_here(i) == "memory_limit"
                  or (self._enforced_here(i) == "mps" and len(indices) == 1)]
        if not fenced:
            return None
        index = max(fenced, key=lambda i: used_mib.get(i, -1))
        used = used_mib.get(index)
        held = f"; it held up to {used} MiB in the node's samples" if used is not None else ""
        return (f"CUDA out of memory on GPU {index}: job {job_id} hit its limit of {limit_mib} MiB, "
                f"enforced by {_ENFORCED_BY[self.mode(index)]}{held}")

    def close(self) -> None:
        """Stop the MPS daemons and let go of NVML. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.mps is not None:
            self.mps.stop_all()
        if self.limits is not None:
            self.limits.close()
