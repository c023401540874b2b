"""FGD's fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC'23, section 3).

For a node n and a task m, ``F_n(m)`` is the node's unallocated GPU capacity that m cannot use:

* m cannot run on n at all (too little CPU or host memory, a GPU model it excludes, no GPU with
  enough room): every unallocated milli-GPU of n is a fragment;
* m can run: for a task of at most one GPU, the GPUs whose free share is below its request are
  fragments; for a multi-GPU task (whole GPUs), every partly allocated GPU is.

Against a target workload M (task classes with their popularity), ``F_n(M) = sum_m p_m F_n(m)``
and the cluster's fragmentation is the sum over nodes. FGD places each task where it increases
``F_n(M)`` least. The measure is a function of a node's state only, so it is memoised by state.

Two ways to build M:

* ``Workload.of(requests)``: one class per (GPUs, milli, models), at its members' median CPU and
  memory; a CPU-only class strands nothing on a node with room for it. Colony's own reading.
* ``Workload.typical(pods)``: FGD's "typical pods" as its simulator builds them
  (``pkg/utils/frag.go: GetTypicalPods``, ``pkg/simulator/analysis.go: SetTypicalPods``): one class
  per exact (CPU, milli, GPUs, model) of the original pod list, CPU-only pods included, the most
  popular first until they cover 95% of the pods, popularity renormalised over those. Its F(M)
  follows ``NodeGpuShareFragAmount``/``FragAmountSumExceptQ3``: host memory is no dimension (FGD's
  ``NodeResource`` has none), and a CPU-only class counts every free milli-GPU of the node as a
  fragment (FGD sums every category but "Q3 satisfied", and a pod without GPUs is "XL"/"XR").
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter

WHOLE = 1000
# FGD's simulator reads a request as Kubernetes' non-zero request: no CPU asked counts as 100m.
DEFAULT_CPU_MILLI = 100
TYPICAL_POPULARITY = 0.95  # generate_config_and_run.py: --pod-popularity-threshold 95


@dataclass(frozen=True, slots=True)
class TaskClass:
    gpus: int
    milli: int  # per GPU; 1000 for whole GPUs
    models: frozenset[str]
    cpu_milli: int
    host_memory_mb: int
    popularity: float


class Workload:
    """A target workload M and a memo of ``F_n(M)`` by node state."""

    def __init__(self, classes: list[TaskClass], *, fgd_rules: bool = False, weights: list[float] | None = None):
        """``weights``: per class, a factor on its popularity in ``F_n(M)`` (``of``: rarity)."""
        self.fgd_rules = fgd_rules
        total = sum(c.popularity for c in classes) or 1.0
        self.classes = [TaskClass(c.gpus, c.milli, c.models, c.cpu_milli, c.host_memory_mb, c.popularity / total)
                        for c in classes]
        self._weights = [c.popularity * (1.0 if weights is None else weights[i]) for i, c in enumerate(self.classes)]
        # Feasibility by CPU and memory only changes at these thresholds: nodes whose free CPU
        # falls between the same two thresholds have the same fragmentation.
        self._cpu_steps = sorted({c.cpu_milli for c in self.classes})
        self._memory_steps = sorted({c.host_memory_mb for c in self.classes})
        self._memo: dict[tuple, float] = {}
        # The CPU a milli-GPU of the workload asks for, its classes weighted by popularity: what a
        # node's free GPUs need of its free CPU (``FragmentationScore.stranded``).
        gpu_classes = [c for c in self.classes if c.gpus]
        milli = sum(c.popularity * c.gpus * c.milli for c in gpu_classes)
        self.cpu_per_milli = sum(c.popularity * c.cpu_milli for c in gpu_classes) / milli if milli else 0.0

    @classmethod
    def of(cls, requests, hosts=None, gangs_by_cpu: bool = False) -> "Workload":
        """Classes from requests (objects with gpus, gpu_milli, gpu_models, cpu_milli,
        host_memory_mb): one per (GPUs, milli, models), at the median CPU and memory of its members.

        ``gangs_by_cpu`` (or ``hosts`` given): a multi-GPU request's class also has its exact CPU.
        A gang takes a whole node's GPUs, so its CPU alone decides which nodes can ever host it;
        at the class's median the few gangs that ask more than most nodes have vanish, and so
        does the cost of breaking the only nodes that fit them (issue 34: 8-GPU pods asking 120
        CPUs fit only the 128-CPU nodes, 39 of 1,213).

        ``hosts``: (GPU model, GPUs, CPU milli, host memory MB) of every node (None: not tracked).
        A multi-GPU class then weighs ``(wide / fit) ** 2`` times its popularity, ``wide`` the
        nodes with GPUs enough for it and ``fit`` those of them with its CPU and memory too: the
        fewer nodes fit it, the more of its supply each one broken takes away. Squared because the
        first power did not protect the 128-CPU nodes on the default list, where that class is 5
        pods in 8,152 (FGD protocol, seed 0: 79.7 / 89.6% at 80 / 90% arrived either way,
        squared 80.0 / 90.0)."""
        split = gangs_by_cpu or hosts is not None
        return cls.of_tally(tally(requests, split), hosts)

    @classmethod
    def of_tally(cls, members: dict[tuple, list], hosts=None) -> "Workload":
        """``of`` from the classes ``tally`` counted (merged across parts with ``merge``)."""
        classes = []
        for (gpus, milli, models, _), (count, cpus, memories) in sorted(
                members.items(), key=lambda kv: (kv[0][0], kv[0][1], sorted(kv[0][2]), kv[0][3])):
            classes.append(TaskClass(gpus, milli, models, _median(cpus, count), _median(memories, count),
                                     float(count)))
        if hosts is None:
            return cls(classes)
        return cls(classes, weights=[_rarity(c, hosts) for c in classes])

    @classmethod
    def typical(cls, requests, threshold: float = TYPICAL_POPULARITY) -> "Workload":
        """FGD's typical pods of a pod list (objects with gpus, gpu_milli, gpu_models, cpu_milli):
        classes by exact request, most popular first (ties: larger CPU, then milli, GPUs, models
        first, FGD's ``sort.Reverse``), cut where they reach ``threshold`` of the pods."""
        counts = Counter()
        for r in requests:
            milli = 0 if r.gpus == 0 else (r.gpu_milli if r.gpus == 1 else WHOLE)
            counts[(r.cpu_milli or DEFAULT_CPU_MILLI, milli, r.gpus, r.gpu_models)] += 1
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0][:3], sorted(kv[0][3])), reverse=True)
        kept, covered = [], 0
        for (cpu, milli, gpus, models), count in ranked:
            if covered >= threshold * total:
                break
            kept.append(TaskClass(gpus, milli, models, cpu, 0, float(count)))
            covered += count
        return cls(kept, fgd_rules=True)

    def node(self, model: str, free: tuple[int, ...], cpu_free: float, memory_free: float) -> float:
        """``F_n(M)`` in milli-GPUs; ``free`` is each GPU's unallocated milli-GPUs (any order)."""
        key = (model, tuple(sorted(free)), bisect_right(self._cpu_steps, cpu_free),
               bisect_right(self._memory_steps, memory_free))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self._compute(model, key[1], cpu_free, memory_free)
        return value

    def _compute(self, model: str, free: tuple[int, ...], cpu_free: float, memory_free: float) -> float:
        total = sum(free)
        if not total:
            return 0.0
        whole = sum(1 for f in free if f >= WHOLE)
        partial = total - whole * WHOLE
        most = free[-1] if free else 0
        fragments = 0.0
        fgd = self.fgd_rules
        for c, weight in zip(self.classes, self._weights):
            if c.gpus == 0 and fgd:
                fragments += weight * total
            elif ((c.models and model not in c.models) or c.cpu_milli > cpu_free
                  or (not fgd and c.host_memory_mb > memory_free)):
                fragments += weight * total
            elif c.gpus == 0:
                continue
            elif c.gpus == 1:
                if most < c.milli:
                    fragments += weight * total
                else:
                    fragments += weight * sum(f for f in free if f < c.milli)
            elif whole < c.gpus:
                fragments += weight * total
            else:
                fragments += weight * partial
        return fragments


def tally(requests, split: bool) -> dict[tuple, list]:
    """``Workload.of``'s classes of ``requests``, counted: (GPUs, milli, models, exact CPU of a
    multi-GPU request if ``split``, else -1) -> [members, Counter of their CPU, of their memory]."""
    groups: dict[tuple, list] = {}
    for r in requests:
        milli = r.gpu_milli if r.gpus == 1 else WHOLE
        groups.setdefault((r.gpus, milli, r.gpu_models, r.cpu_milli if split and r.gpus > 1 else -1), []).append(r)
    return {key: [len(group), Counter(map(_cpu, group)), Counter(map(_memory, group))] for key, group in groups.items()}


_cpu, _memory = attrgetter("cpu_milli"), attrgetter("host_memory_mb")


def merge(into: dict[tuple, list], part: dict[tuple, list]) -> None:
    """Add one tally to another (``part`` is left as it was)."""
    for key, (count, cpus, memories) in part.items():
        entry = into.get(key)
        if entry is None:
            into[key] = [count, Counter(cpus), Counter(memories)]
        else:
            entry[0] += count
            entry[1].update(cpus)
            entry[2].update(memories)


def _median(counts: Counter, members: int):
    """The value at ``members // 2`` of the counted values in order (as ``sorted(values)[n // 2]``)."""
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > members // 2:
            return value
    raise ValueError("no members")


class QueueTallies:
    """``Workload.of`` over a cycle's requests, the queue's counted by tenant and kept from one
    cycle to the next while the tenant's pending jobs are the same: a cycle that places something
    after a few jobs ended counted every one of 200,000 requests again (a quarter of a second),
    where now it counts the few tenants whose queue changed. The same workload to the last digit
    (``tests/scheduling/test_fragmentation.py``)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[list, dict[tuple, list]]] = {}

    def workload(self, by_tenant: dict[str, list], running, hosts) -> Workload:
        """``Workload.of`` of every request in ``by_tenant``'s lists (tenant -> its pending
        requests, lists not changed in place) and in ``running``, weighed against ``hosts``."""
        merged: dict[tuple, list] = {}
        kept: dict[str, tuple[list, dict[tuple, list]]] = {}
        for tenant, jobs in by_tenant.items():
            found = self._kept.get(tenant)
            if found is None or (found[0] is not jobs and found[0] != jobs):
                found = (jobs, tally(jobs, True))
            kept[tenant] = found
            merge(merged, found[1])
        self._kept = kept
        merge(merged, tally(running, True))
        return Workload.of_tally(merged, hosts)


def _rarity(task: TaskClass, hosts) -> float:
    """``Workload.of``'s weight on a multi-GPU class: (nodes with its GPUs / those with its CPU
    and memory too) squared; 1 for a one-GPU class or one no node fits."""
    if task.gpus <= 1:
        return 1.0
    wide = fit = 0
    for model, gpus, cpu, memory in hosts:
        if gpus >= task.gpus and (not task.models or model in task.models):
            wide += 1
            fit += (cpu is None or cpu >= task.cpu_milli) and (memory is None or memory >= task.host_memory_mb)
    return (wide / fit) ** 2 if fit else 1.0
