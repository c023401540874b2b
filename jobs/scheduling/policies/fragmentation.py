"""FGD's fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC'23, section 3).

For a node n and a task m, ``F_n(m)`` is the node's unallocated GPU capacity that m cannot use:

* m cannot run on n at all (too little CPU or host memory, a GPU model it excludes, no GPU with
  enough room): every unallocated milli-GPU of n is a fragment;
* m can run: for a task of at most one GPU, the GPUs whose free share is below its request are
  fragments; for a multi-GPU task (whole GPUs), every partly allocated GPU is.

Against a target workload M (task classes with their popularity), ``F_n(M) = sum_m p_m F_n(m)``
and the cluster's fragmentation is the sum over nodes. FGD places each task where it increases
``F_n(M)`` least. The measure is a function of a node's state only, so it is memoised by state.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

WHOLE = 1000


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

    def __init__(self, classes: list[TaskClass]):
        total = sum(c.popularity for c in classes) or 1.0
        self.classes = [TaskClass(c.gpus, c.milli, c.models, c.cpu_milli, c.host_memory_mb, c.popularity / total)
                        for c in classes]
        # Feasibility by CPU and memory only changes at these thresholds: nodes whose free CPU
        # falls between the same two thresholds have the same fragmentation.
        self._cpu_steps = sorted({c.cpu_milli for c in self.classes})
        self._memory_steps = sorted({c.host_memory_mb for c in self.classes})
        self._memo: dict[tuple, float] = {}

    @classmethod
    def of(cls, requests) -> "Workload":
        """Classes from requests (objects with gpus, gpu_milli, gpu_models, cpu_milli,
        host_memory_mb): one per (GPUs, milli, models), at the median CPU and memory of its members."""
        members: dict[tuple, list] = {}
        for r in requests:
            milli = r.gpu_milli if r.gpus == 1 else WHOLE
            members.setdefault((r.gpus, milli, r.gpu_models), []).append(r)
        classes = []
        for (gpus, milli, models), group in sorted(members.items(), key=lambda kv: (kv[0][0], kv[0][1], sorted(kv[0][2]))):
            cpu = sorted(r.cpu_milli for r in group)[len(group) // 2]
            memory = sorted(r.host_memory_mb for r in group)[len(group) // 2]
            classes.append(TaskClass(gpus, milli, models, cpu, memory, float(len(group))))
        return cls(classes)

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
        for c in self.classes:
            if (c.models and model not in c.models) or c.cpu_milli > cpu_free or c.host_memory_mb > memory_free:
                fragments += c.popularity * total
            elif c.gpus == 0:
                continue
            elif c.gpus == 1:
                if most < c.milli:
                    fragments += c.popularity * total
                else:
                    fragments += c.popularity * sum(f for f in free if f < c.milli)
            elif whole < c.gpus:
                fragments += c.popularity * total
            else:
                fragments += c.popularity * partial
        return fragments
