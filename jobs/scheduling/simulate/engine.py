"""The replay driver: a virtual clock that feeds a policy the same snapshots production would.

Events are job arrivals (from the trace), job completions (from each job's remaining work and
its current speed) and scheduling cycles. A cycle runs on the production grid (every
``interval`` seconds, default 2 s): the first grid point after an arrival or a completion (the
nudge), and then every interval for as long as the policy keeps changing things (throttling,
preemption, reservations, a capped cycle that left placeable work). A quiet cluster costs
nothing between events, so months of trace replay in seconds.

The co-location model has two parts. Over-subscription: a job adds ``utilisation x duty_cycle``
to each of its GPUs' load, and a GPU whose load exceeds 1 slows every resident by the same factor
(1 / load). Interference: every other resident of a GPU costs a job ``interference x its duty
cycle`` of its speed, multiplicatively, whatever the summed load: co-located kernels contend for
caches, memory bandwidth and the block scheduler even when SMs are spare, for the share of time
the neighbour runs (a suspended one costs nothing). A job
progresses at its duty cycle times the slowest factor among its GPUs. A preempted job is
requeued with the work it had done (training jobs checkpoint) plus ``restart_overhead_s`` to do
again.

``DEFAULT_INTERFERENCE`` (0.35) is what an H100 measured (bench/gpu_duty_cycle.py and
gpu_isolation.py, docs/operations.md "Sharing GPUs safely"): two compute-bound matrix-product jobs lost
0.3-0.4 of their speed each under MPS (0.52-0.55 time-sliced, an upper bound), and a guaranteed
job beside a borrower at duty 0.5 / 0.25 / 0.1 kept 84 / 93 / 96% of its speed, which this
model's ``1 - interference x duty`` gives at 0.32 / 0.28 / 0.4. Reports give results at 0 and at
the default; the flat 0.2 penalty the scheduling-quality issue first measured against, and 0.5
(time-sliced), are stress cases (``--interference``). Published co-location studies find the
slowdown real and pair-dependent, never zero: Robroek et al., "An Analysis of Collocation on GPUs
for Deep Learning Training" (2022, arXiv 2209.06018), and Elvinger et al., "Understanding GPU
Resource Interference One Level Deeper" (SoCC 2025).

Host resources: a node may track CPU and host memory (``NodeSpec.cpu_milli``,
``host_memory_mb``). A job's request is split over its nodes in proportion to its GPUs there; a
placement that leaves a node over either is carried out and counted (``cpu_violations``,
``host_memory_violations``), as GPU memory is. CPU-only pods (``gpus == 0``) are placed by the
caller (``start_cpu_only``); the core never sees them, only a node's CPU and memory net of them.

What the scheduler sees (``Knowledge``): by default the truth, at once. With noise and delay,
the live utilisation of a GPU in a snapshot is its load ``delay_s`` ago times a seeded
log-normal error, and a job's memory the scheduler packs by is its ``seen_memory_mib`` (a
profile or request the loader drew with error), while the replay runs on the true peak.

The policy is any ``policy(snapshot, now, config) -> Decisions`` (``jobs.scheduling.policies``).
Memory is never overcommitted by this driver: a placement that would put more memory on a GPU
than it has is still carried out and counted as a violation, which tests assert stays at zero.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace

import random

from jobs.scheduling.carry import Carry
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.decisions import Decisions
from jobs.scheduling.simulate.trace import Trace, TraceJob
from jobs.scheduling.snapshot import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    JobClass,
    JobRequest,
    LiveReadings,
    NodeState,
    RunningJob,
    TenantQuota,
)
from jobs.scheduling.usage import charged_milli, decay_usage

INF = math.inf
DEFAULT_INTERFERENCE = 0.35


@dataclass(frozen=True, slots=True)
class Knowledge:
    """How well the scheduler knows the cluster: ``usage_noise`` is the sigma of a log-normal
    error on each GPU's live utilisation, ``usage_delay_s`` how old the reading is."""

    usage_noise: float = 0.0
    usage_delay_s: float = 0.0
    seed: int = 0

    @property
    def perfect(self) -> bool:
        return self.usage_noise == 0 and self.usage_delay_s == 0


PERFECT = Knowledge()


@dataclass(slots=True)
class JobRecord:
    """What happened to one job during a replay."""

    job: TraceJob
    first_start: float | None = None
    finish: float | None = None
    queued_s: float = 0.0
    preemptions: int = 0
    throttles: int = 0
    guaranteed_gpu_s: float = 0.0
    opportunistic_gpu_s: float = 0.0

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.submit_s


@dataclass(slots=True)
class _Gpu:
    id: int
    index: int
    node: int
    model: str
    memory_mib: int
    residents: set[int] = field(default_factory=set)
    load: float = 0.0
    memory_used: int = 0
    milli: int = 0  # requested milli-GPUs of the residents (may pass 1000: opportunistic joins)
    # (time, load) readings, oldest first, for a delayed view of the load.
    history: deque = field(default_factory=deque)


@dataclass(slots=True)
class _Run:
    job: TraceJob
    job_class: JobClass
    gpu_ids: tuple[int, ...]
    memory: tuple[int, ...]  # per GPU, MiB
    host: tuple[tuple[int, int, int], ...]  # (node, CPU milli, host memory MB) per node it runs on
    started_at: float
    duty: float
    remaining: float  # solo-seconds of work left
    attained_before: float  # GPU-seconds from earlier runs
    rate: float = 1.0
    settled_at: float = 0.0
    served: float = 0.0  # GPU-seconds of this run at the speed it ran, up to ``settled_at``
    # Set anew on every change of speed or duty cycle, from the replay's one counter: a run that
    # restarts after a preemption must not match its earlier run's completion still in the heap
    # (per-run numbers did: a preempted job finished when its first run would have).
    version: int = 0
    seen: tuple[tuple, RunningJob] | None = None  # ((version, duty), what the last snapshot showed)

    @property
    def held_milli(self) -> int:
        return len(self.gpu_ids) * self.job.gpu_milli

    def served_at(self, now: float) -> float:
        """GPU-seconds of this run at the speed it ran, up to ``now`` (its speed unchanged since
        ``settled_at``)."""
        return self.served + self.rate * (now - self.settled_at) * self.held_milli / WHOLE_GPU_MILLI


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster between two events (a step function; ``t`` is where the step begins)."""

    t: float
    busy_gpus: int
    utilisation: float  # sum over GPUs of min(1, load)
    memory_mib: float
    allocated_milli: int  # requests placed (a GPU counted once per resident)
    pending: int
    running: int
    physical_milli: int = 0  # requests placed, each GPU capped at 1000 (FGD's allocation)


@dataclass(slots=True)
class ReplayResult:
    policy: str
    trace: Trace
    records: dict[int, JobRecord]
    samples: list[Sample]
    start: float
    end: float
    cycles: int = 0
    preemptions: int = 0
    throttles: int = 0
    suspensions: int = 0  # throttles to duty cycle 0 (counted among the throttles too)
    memory_violations: int = 0
    cpu_violations: int = 0
    host_memory_violations: int = 0
    unfinished: list[int] = field(default_factory=list)
    tenant_gpu_s: dict[str, float] = field(default_factory=dict)
    # Integrals over the replay (value x seconds).
    busy_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    memory_mib_s: float = 0.0
    physical_gpu_s: float = 0.0
    # The same integrals up to the last arrival: the window in which the trace, not the tail of
    # its longest jobs, sets the load.
    arrivals_end: float | None = None
    window_busy_gpu_s: float = 0.0
    window_used_gpu_s: float = 0.0
    window_memory_mib_s: float = 0.0
    window_physical_gpu_s: float = 0.0
    interference: float = 0.0


class Replay:
    def __init__(self, trace: Trace, policy, config: SchedulerConfig = SchedulerConfig(), *, name: str = "",
                 interval: float = 2.0, restart_overhead_s: float = 30.0, max_time: float | None = None,
                 interference: float = 0.0, knowledge: Knowledge = PERFECT):
        if not 0.0 <= interference < 1.0:
            raise ValueError("interference is a share of speed lost per co-resident, in [0, 1)")
        self.trace, self.policy, self.config = trace, policy, config
        # The production policy runs as the scheduling loop runs it: with what its last cycle left
        # (so does any policy built on it that takes a carry: the same decisions, sooner).
        self.carry = Carry() if "carry" in inspect.signature(policy).parameters else None
        self.promises: tuple = ()  # what the last cycle's reclaims promised, as the service keeps them
        self.interval, self.restart_overhead_s = interval, restart_overhead_s
        self.max_time = max_time
        self.interference, self.knowledge = interference, knowledge
        self._noise = random.Random(f"knowledge:{knowledge.seed}")
        self.node_cpu = [0] * len(trace.nodes)  # CPU milli requested on each node
        self.node_host_memory = [0] * len(trace.nodes)
        self.node_cpu_only = [(0, 0)] * len(trace.nodes)  # (CPU, memory) of CPU-only pods there
        self.cpu_only: dict[int, int] = {}  # CPU-only pod -> node
        self.gpus: list[_Gpu] = []
        self.node_gpus: list[list[int]] = []
        for n, spec in enumerate(trace.nodes):
            ids = []
            for index in range(spec.gpus):
                ids.append(len(self.gpus))
                self.gpus.append(_Gpu(len(self.gpus), index, n, spec.model, spec.memory_mib))
            self.node_gpus.append(ids)
        self.node_cache: list[NodeState | None] = [None] * len(trace.nodes)
        # The readings of each GPU the last snapshot showed (load, memory used), kept for nodes whose
        # cache entry still holds.
        self.gpu_load: dict[int, float] = {}
        self.gpu_memory_used: dict[int, int] = {}
        self.quotas = {q.name: q for q in trace.quotas}
        self.usage: dict[str, float] = defaultdict(float)
        self.held: dict[str, int] = defaultdict(int)  # milli-GPUs per tenant
        self.records = {job.id: JobRecord(job) for job in trace.jobs}
        self.arrivals = deque(sorted(trace.jobs, key=lambda j: (j.submit_s, j.id)))
        self.pending: dict[int, JobRequest] = {}
        self.pending_since: dict[int, float] = {}
        self.remaining: dict[int, float] = {}  # work left of requeued jobs
        self.attained: dict[int, float] = defaultdict(float)
        self.running: dict[int, _Run] = {}
        self.completions: list[tuple[float, int, int]] = []
        self._versions = itertools.count(1)
        self.now = 0.0
        self.next_cycle: float | None = None
        self.result = ReplayResult(name or getattr(policy, "__name__", "policy"), trace, self.records, [], 0.0, 0.0,
                                   interference=interference)
        self.busy = 0
        self.used = 0.0
        self.memory_used = 0
        self.allocated = 0
        self.physical = 0

    # -- the clock ---------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        if self.arrivals:
            self.now = self.result.start = self.arrivals[0].submit_s
        while True:
            t_arrival = self.arrivals[0].submit_s if self.arrivals else INF
            t_done = self._next_completion()
            t_cycle = self.next_cycle if self.next_cycle is not None else INF
            t = min(t_arrival, t_done, t_cycle)
            if t == INF or (self.max_time is not None and t > self.result.start + self.max_time):
                break
            self._advance(t)
            if t_done == t:
                self._complete_due(t)
            elif t_arrival == t:
                while self.arrivals and self.arrivals[0].submit_s <= t:
                    self.enqueue(self.arrivals.popleft(), t)
                if not self.arrivals:
                    self._close_arrival_window()
                self._nudge(t)
            else:
                self.next_cycle = None
                self.cycle(t)
        self.result.end = self.now
        self.result.unfinished = sorted(j for j, r in self.records.items() if r.finish is None)
        self._sample()
        return self.result

    def _close_arrival_window(self) -> None:
        r = self.result
        r.arrivals_end = self.now
        r.window_busy_gpu_s, r.window_used_gpu_s, r.window_memory_mib_s = r.busy_gpu_s, r.used_gpu_s, r.memory_mib_s
        r.window_physical_gpu_s = r.physical_gpu_s

    def _nudge(self, t: float) -> None:
        grid = math.ceil(t / self.interval - 1e-9) * self.interval
        if self.next_cycle is None or grid < self.next_cycle:
            self.next_cycle = grid

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            r = self.result
            r.busy_gpu_s += self.busy * dt
            r.used_gpu_s += self.used * dt
            r.memory_mib_s += self.memory_used * dt
            r.physical_gpu_s += self.physical / WHOLE_GPU_MILLI * dt
            half_life = self.config.usage_half_life_s
            # Fair share decays what each tenant is charged (``usage.charged_milli``: a borrower on
            # an over-committed GPU counts its share), as the core counts what tenants hold.
            charged: dict[str, int] = defaultdict(int)
            for run in self.running.values():
                record = self.records[run.job.id]
                gpu_s = run.held_milli / WHOLE_GPU_MILLI * dt
                if run.job_class is JobClass.GUARANTEED:
                    record.guaranteed_gpu_s += gpu_s
                    charged[run.job.tenant] += run.held_milli
                else:
                    record.opportunistic_gpu_s += gpu_s
                    charged[run.job.tenant] += charged_milli(run.job.gpu_milli,
                                                             [self.gpus[g].milli for g in run.gpu_ids], True)
            for tenant in set(self.usage) | set(self.held):
                self.usage[tenant] = decay_usage(self.usage[tenant], charged[tenant] / WHOLE_GPU_MILLI, dt, half_life)
                r.tenant_gpu_s[tenant] = r.tenant_gpu_s.get(tenant, 0.0) + self.held[tenant] / WHOLE_GPU_MILLI * dt
        self.now = max(self.now, t)

    def _sample(self) -> None:
        sample = Sample(self.now, self.busy, self.used, self.memory_used, self.allocated, len(self.pending),
                        len(self.running), self.physical)
        samples = self.result.samples
        if samples and samples[-1].t == self.now:
            samples[-1] = sample
        else:
            samples.append(sample)

    # -- jobs entering and leaving ---------------------------------------------------------------------

    def enqueue(self, job: TraceJob, t: float) -> None:
        self.pending[job.id] = JobRequest(
            id=job.id, tenant=job.tenant, gpus=job.gpus, submitted_at=job.submit_s,
            gpu_memory_mib=job.seen_memory_mib if job.seen_memory_mib is not None else job.memory_mib,
            priority=job.priority, gpu_milli=job.gpu_milli, gpu_models=job.gpu_models,
            opportunistic_only=job.opportunistic_only, expected_runtime_s=job.duration_s,
            attained_gpu_s=self.attained[job.id], **self._host_request(job),
        )
        self.pending_since[job.id] = t
        self.usage.setdefault(job.tenant, 0.0)
        self._sample()

    @staticmethod
    def _host_request(job: TraceJob) -> dict:
        return {"cpu_milli": job.cpu_milli, "host_memory_mb": job.host_memory_mb}

    def _next_completion(self) -> float:
        heap = self.completions
        while heap:
            finish, job_id, version = heap[0]
            run = self.running.get(job_id)
            if run is not None and run.version == version:
                return finish
            heapq.heappop(heap)
        return INF

    def _complete_due(self, t: float) -> None:
        while self._next_completion() <= t:
            _, job_id, _ = heapq.heappop(self.completions)
            run = self._stop(job_id)
            self.records[job_id].finish = t
            self.attained[job_id] += self._attained_this_run(run)
        self._sample()
        self._nudge(t)

    def _attained_this_run(self, run: _Run) -> float:
        return (self.now - run.started_at) * run.held_milli / WHOLE_GPU_MILLI  # (a half-GPU run counts half)

    def _stop(self, job_id: int) -> _Run:
        run = self.running.pop(job_id)
        self._settle(run)
        self.held[run.job.tenant] -= run.held_milli
        self.allocated -= run.held_milli
        for node, cpu, memory in run.host:
            self.node_cpu[node] -= cpu
            self.node_host_memory[node] -= memory
        touched = set()
        for gpu_id, memory in zip(run.gpu_ids, run.memory):
            gpu = self.gpus[gpu_id]
            self._gpu_out(gpu)
            gpu.residents.discard(job_id)
            gpu.load -= run.job.utilisation * run.duty
            gpu.memory_used -= memory
            gpu.milli -= run.job.gpu_milli
            if not gpu.residents:
                gpu.load, gpu.memory_used, gpu.milli = 0.0, 0, 0
            self._gpu_in(gpu)
            touched.add(gpu_id)
        self._rerate(touched)
        return run

    def _host_split(self, job: TraceJob, gpu_ids: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """The job's CPU and host memory per node, in proportion to its GPUs there (the last
        node takes the rounding, so the parts sum to the request)."""
        per_node: dict[int, int] = {}
        for g in gpu_ids:
            node = self.gpus[g].node
            per_node[node] = per_node.get(node, 0) + 1
        parts, cpu_left, memory_left = [], job.cpu_milli, job.host_memory_mb
        for i, (node, count) in enumerate(per_node.items()):
            last = i == len(per_node) - 1
            cpu = cpu_left if last else job.cpu_milli * count // len(gpu_ids)
            memory = memory_left if last else job.host_memory_mb * count // len(gpu_ids)
            cpu_left, memory_left = cpu_left - cpu, memory_left - memory
            parts.append((node, cpu, memory))
        return tuple(parts)

    def _take_host(self, node: int, cpu: int, memory: int) -> None:
        self.node_cpu[node] += cpu
        self.node_host_memory[node] += memory
        spec = self.trace.nodes[node]
        if cpu and spec.cpu_milli is not None and self.node_cpu[node] > spec.cpu_milli:
            self.result.cpu_violations += 1
        if memory and spec.host_memory_mb is not None and self.node_host_memory[node] > spec.host_memory_mb:
            self.result.host_memory_violations += 1
        self.node_cache[node] = None

    def start_cpu_only(self, job_id: int, node: int) -> None:
        """Run a CPU-only pod on a node (the caller chose it): it holds CPU and memory there."""
        self.pending.pop(job_id, None)
        self.pending_since.pop(job_id, None)
        job = self.records[job_id].job
        self.records[job_id].first_start = self.now
        self.cpu_only[job_id] = node
        cpu, memory = self.node_cpu_only[node]
        self.node_cpu_only[node] = (cpu + job.cpu_milli, memory + job.host_memory_mb)
        self._take_host(node, job.cpu_milli, job.host_memory_mb)

    def host_free(self, node: int) -> tuple[int | None, int | None]:
        """Free CPU milli and host memory MB on a node (None: not tracked)."""
        spec = self.trace.nodes[node]
        cpu = None if spec.cpu_milli is None else spec.cpu_milli - self.node_cpu[node]
        memory = None if spec.host_memory_mb is None else spec.host_memory_mb - self.node_host_memory[node]
        return cpu, memory

    def _start(self, job_id: int, gpu_ids: tuple[int, ...], job_class: JobClass, duty: float) -> None:
        request = self.pending.pop(job_id)
        job = self.records[job_id].job
        record = self.records[job_id]
        record.queued_s += self.now - self.pending_since.pop(job_id)
        if record.first_start is None:
            record.first_start = self.now
        memory = tuple(self._memory_of(job, self.gpus[g]) for g in gpu_ids)
        host = self._host_split(job, gpu_ids)
        for node, cpu, host_memory in host:
            self._take_host(node, cpu, host_memory)
        run = _Run(job, job_class, gpu_ids, memory, host, started_at=self.now, duty=duty,
                   remaining=self.remaining.pop(job_id, job.duration_s), attained_before=request.attained_gpu_s,
                   settled_at=self.now)
        self.running[job_id] = run
        self.held[job.tenant] += run.held_milli
        self.allocated += run.held_milli
        for gpu_id, mib in zip(gpu_ids, memory):
            gpu = self.gpus[gpu_id]
            self._gpu_out(gpu)
            gpu.residents.add(job_id)
            gpu.load += job.utilisation * duty
            gpu.memory_used += mib
            gpu.milli += job.gpu_milli
            if gpu.memory_used > gpu.memory_mib:
                self.result.memory_violations += 1
            self._gpu_in(gpu)
        self._rerate(set(gpu_ids))

    @staticmethod
    def _memory_of(job: TraceJob, gpu: _Gpu) -> int:
        if job.memory_mib is not None:
            return job.memory_mib
        return gpu.memory_mib * job.gpu_milli // WHOLE_GPU_MILLI  # (rounded down, as placement.Shape.memory_on)

    def _preempt(self, job_id: int) -> None:
        run = self._stop(job_id)
        self.attained[job_id] += self._attained_this_run(run)
        self.remaining[job_id] = run.remaining + self.restart_overhead_s
        self.records[job_id].preemptions += 1
        self.enqueue(run.job, self.now)

    def _throttle(self, job_id: int, duty: float) -> None:
        run = self.running[job_id]
        self._settle(run)
        for gpu_id in run.gpu_ids:
            gpu = self.gpus[gpu_id]
            self._gpu_out(gpu)
            gpu.load += run.job.utilisation * (duty - run.duty)
            self._gpu_in(gpu)
        run.duty = duty
        self.records[job_id].throttles += 1
        self._rerate(set(run.gpu_ids))

    # -- GPU load, job speed -----------------------------------------------------------------------------

    def _gpu_out(self, gpu: _Gpu) -> None:
        """Take a GPU's contribution out of the cluster totals before changing it."""
        self.busy -= bool(gpu.residents)
        self.used -= min(1.0, gpu.load)
        self.memory_used -= gpu.memory_used
        self.physical -= min(WHOLE_GPU_MILLI, gpu.milli)
        self.node_cache[gpu.node] = None

    def _gpu_in(self, gpu: _Gpu) -> None:
        self.busy += bool(gpu.residents)
        self.used += min(1.0, gpu.load)
        self.memory_used += gpu.memory_used
        self.physical += min(WHOLE_GPU_MILLI, gpu.milli)
        if not self.knowledge.perfect:
            self._remember_load(gpu)
        if not self.busy:  # drop the rounding the running float sum gathered
            self.used = 0.0

    def _settle(self, run: _Run) -> None:
        run.served = run.served_at(self.now)
        run.remaining = max(0.0, run.remaining - run.rate * (self.now - run.settled_at))
        run.settled_at = self.now

    def _rerate(self, gpu_ids: set[int]) -> None:
        jobs = {job_id for g in gpu_ids for job_id in self.gpus[g].residents}
        for job_id in jobs:
            run = self.running[job_id]
            if self.interference:
                slowest = min(self._interfered(job_id, self.gpus[g]) / max(1.0, self.gpus[g].load)
                              for g in run.gpu_ids)
            else:
                slowest = min(1.0 / max(1.0, self.gpus[g].load) for g in run.gpu_ids)
            rate = run.duty * slowest
            if abs(rate - run.rate) < 1e-12 and run.version:
                continue
            self._settle(run)
            run.rate = rate
            run.version = next(self._versions)
            finish = self.now + run.remaining / rate if rate > 0 else INF
            heapq.heappush(self.completions, (finish, job_id, run.version))

    def _interfered(self, job_id: int, gpu: _Gpu) -> float:
        """The share of its speed a job keeps next to the GPU's other residents."""
        keep = 1.0
        for other in gpu.residents:
            if other != job_id:
                keep *= 1.0 - self.interference * self.running[other].duty
        return keep

    # -- a scheduling cycle ----------------------------------------------------------------------------

    def _remember_load(self, gpu: _Gpu) -> None:
        history = gpu.history
        history.append((self.now, gpu.load if gpu.residents else 0.0))
        horizon = self.now - self.knowledge.usage_delay_s
        while len(history) > 1 and history[1][0] <= horizon:
            history.popleft()

    def _seen_load(self, gpu: _Gpu) -> float:
        """The load the scheduler reads: ``usage_delay_s`` old, with a log-normal error."""
        load = gpu.load if gpu.residents else 0.0
        if self.knowledge.perfect:
            return min(1.0, load)
        horizon = self.now - self.knowledge.usage_delay_s
        seen = 0.0  # no change before the horizon: the GPU was idle then
        for t, past in gpu.history:  # (time, load from then on), oldest first
            if t > horizon:
                break
            seen = past
        load = seen
        if self.knowledge.usage_noise:
            load *= self._noise.lognormvariate(0.0, self.knowledge.usage_noise)
        return min(1.0, load)

    def _host_capacity(self, n: int) -> dict:
        """What the core sees of a node's CPU and memory: capacity net of CPU-only pods there."""
        spec = self.trace.nodes[n]
        cpu_only, memory_only = self.node_cpu_only[n]
        return {"cpu_milli": None if spec.cpu_milli is None else spec.cpu_milli - cpu_only,
                "host_memory_mb": None if spec.host_memory_mb is None else spec.host_memory_mb - memory_only}

    def snapshot(self) -> ClusterSnapshot:
        nodes = []
        knowing = self.knowledge.perfect
        for n, spec in enumerate(self.trace.nodes):
            node = self.node_cache[n] if knowing else None
            if node is None:
                node_gpus = [self.gpus[i] for i in self.node_gpus[n]]
                for g in node_gpus:
                    self.gpu_load[g.id], self.gpu_memory_used[g.id] = self._seen_load(g), g.memory_used
                node = self.node_cache[n] = NodeState(
                    spec.name, tuple(GpuState(g.id, g.index, g.model, g.memory_mib) for g in node_gpus),
                    rack=spec.rack, intra_node_gb_per_s=spec.intra_node_gb_per_s, **self._host_capacity(n))
            nodes.append(node)
        running = tuple(self._running_job(run) for run in self.running.values())
        tenants = tuple(
            replace(self._quota(tenant), decayed_usage=self.usage[tenant]) for tenant in sorted(self.usage)
        )
        # (each run's service at the speed it ran: what the loop measures from the live readings,
        # ``jobs.services.service_meter``, here exact)
        now = self.now
        readings = LiveReadings(gpus=dict(self.gpu_load), gpu_memory_used_mib=dict(self.gpu_memory_used),
                                jobs={run.job.id: run.job.utilisation * run.rate for run in self.running.values()},
                                served_gpu_s={run.job.id: run.served_at(now) for run in self.running.values()})
        return ClusterSnapshot(nodes=tuple(nodes), pending=tuple(self.pending.values()), tenants=tenants,
                               running=running, promises=self.promises, readings=readings)

    def _running_job(self, run: _Run) -> RunningJob:
        """The run as the core sees it, rebuilt only when its speed or duty cycle changed (its
        live utilisation, which moves with its speed, is a reading of the snapshot's)."""
        if run.seen is None or run.seen[0] != (run.version, run.duty):
            run.seen = ((run.version, run.duty), RunningJob(
                id=run.job.id, tenant=run.job.tenant, job_class=run.job_class, gpu_ids=run.gpu_ids,
                started_at=run.started_at, memory_mib=self._seen_memory(run), gpu_milli=run.job.gpu_milli,
                priority=run.job.priority, expected_runtime_s=run.job.duration_s, duty_cycle=run.duty,
                solo_utilisation=run.job.utilisation,
                attained_gpu_s=run.attained_before, **self._host_request(run.job),
                checkpoints=True,  # (a preempted job resumes with its work done: module docstring)
            ))
        return run.seen[1]

    @staticmethod
    def _seen_memory(run: _Run) -> int:
        """The scheduler's idea of the job's memory: what it was told when not the truth."""
        seen = run.job.seen_memory_mib
        return max(run.memory) if seen is None else seen

    def _quota(self, tenant: str) -> TenantQuota:
        quota = self.quotas.get(tenant)
        if quota is None:
            quota = self.quotas[tenant] = TenantQuota(tenant, 0, len(self.gpus))
        return quota

    def cycle(self, t: float) -> Decisions:
        if self.carry is None:
            decisions = self.policy(self.snapshot(), t, self.config)
        else:
            decisions = self.policy(self.snapshot(), t, self.config, self.carry)
        result = self.result
        result.cycles += 1
        for preempt in decisions.preemptions:
            if preempt.job_id in self.running:
                self._preempt(preempt.job_id)
                result.preemptions += 1
        for throttle in decisions.throttles:
            if throttle.job_id in self.running:
                self._throttle(throttle.job_id, throttle.duty_cycle)
                result.throttles += 1
                result.suspensions += throttle.duty_cycle <= 0
        for place in decisions.placements:
            if place.job_id in self.pending:
                self._start(place.job_id, place.gpu_ids, place.job_class, place.duty_cycle)
        self.promises = decisions.promises
        reserved = {r.job_id: r.since for r in decisions.reservations}
        for job_id, request in self.pending.items():
            since = reserved.get(job_id)
            if since != request.reserved_since:
                self.pending[job_id] = replace(request, reserved_since=since)
        self._sample()
        if decisions.preemptions or decisions.throttles or (decisions.placements and self.pending):
            self.next_cycle = t + self.interval
        elif decisions.reservations:
            # A held reservation changes nothing until it lapses (or an event nudges a cycle).
            until = min(r.until for r in decisions.reservations)
            self._nudge(max(until, t + self.interval))
        return decisions


def replay(trace: Trace, policy, config: SchedulerConfig = SchedulerConfig(), **options) -> ReplayResult:
    return Replay(trace, policy, config, **options).run()
