"""The GPU-sharing baselines of FGD's evaluation (Weng et al., ATC'23), by their names, placing by
request: a pod's ``gpu_milli`` share of a GPU (whole GPUs for multi-GPU pods), its CPU and host
memory on the node, its GPU models. Each GPU holds at most 1000 milli-GPUs of requests.

* ``random_fit``: a feasible node chosen at random (seeded by the job), first GPUs that fit.
* ``best_fit``: the node with the least resources left after placing, as the weighted sum of its
  free GPU share and free CPU share (FGD's "Best-fit"); the tightest GPU in it.
* ``gpu_packing``: a GPU already partly allocated first, then a node with allocated GPUs, then an
  idle node (FGD's "GPU Packing"); the tightest fit within each tier.
* ``fgd``: the placement that increases the node's fragmentation ``F_n(M)`` least, M being the
  classes of the requests the snapshot holds (running and pending), weighted by their count.

Jobs go in priority, then submit order; one that fits nowhere waits (FGD counts it as failed:
on a cluster where nothing leaves it would never fit). No quotas, no preemption, no
over-subscription. A gang wider than any node takes whole free GPUs over the fewest nodes.
"""

from __future__ import annotations

import random
from bisect import insort

from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place
from jobs.scheduling.policies.fragmentation import WHOLE, TaskClass, Workload
from jobs.scheduling.reasons import PendingReason, ReasonCode
from jobs.scheduling.snapshot import ClusterSnapshot, JobRequest

INF = float("inf")


class _Node:
    __slots__ = ("name", "gpus", "free", "memory", "cpu", "host_memory", "cpu_cap", "gpu_count", "model", "static",
                 "key", "most", "position")

    def __init__(self, state):
        self.name = state.name
        self.gpus = list(state.gpus)
        self.free = [0 if g.busy else WHOLE for g in self.gpus]
        self.memory = [g.memory_mib for g in self.gpus]
        cpu, memory = state.cpu_milli, state.host_memory_mb
        self.cpu = INF if cpu is None else cpu
        self.host_memory = INF if memory is None else memory
        self.cpu_cap = cpu or 0
        self.gpu_count = len(self.gpus)
        self.model = self.gpus[0].model if self.gpus else ""
        self.static = (tuple(g.model for g in self.gpus), tuple(g.memory_mib for g in self.gpus), self.cpu_cap)
        self.key = None
        self.most = 0

    def state(self) -> tuple:
        """Everything a score may look at: equal states score alike, whichever node has them."""
        if self.key is None:
            self.key = (self.static, tuple(self.free), tuple(self.memory), self.cpu, self.host_memory)
        return self.key


class Cluster:
    """The free share, GPU memory, CPU and host memory of every schedulable node, after the
    snapshot's running jobs; consumed as a cycle places jobs."""

    def __init__(self, snapshot: ClusterSnapshot):
        self.nodes = [_Node(n) for n in snapshot.nodes if n.schedulable and n.gpus]
        where = {g.id: (node, i) for node in self.nodes for i, g in enumerate(node.gpus)}
        for job in snapshot.running:
            on_node: dict[int, int] = {}
            for gpu_id in job.gpu_ids:
                if gpu_id not in where:
                    continue
                node, i = where[gpu_id]
                node.free[i] -= job.gpu_milli
                node.memory[i] -= job.memory_mib if job.memory_mib is not None else node.gpus[i].memory_mib
                on_node[id(node)] = on_node.get(id(node), 0) + 1
            for node in {id(where[g][0]): where[g][0] for g in job.gpu_ids if g in where}.values():
                share = on_node[id(node)] / len(job.gpu_ids)
                node.cpu -= job.cpu_milli * share
                node.host_memory -= job.host_memory_mb * share
        # Nodes in the same state score alike: a job looks at one node per state (the first).
        self.groups: dict[tuple, list[_Node]] = {}
        for position, node in enumerate(self.nodes):
            node.most = max(node.free)
            node.position = position
            self.groups.setdefault(node.state(), []).append(node)

    def _regroup(self, node: _Node, old: tuple) -> None:
        members = self.groups[old]
        members.remove(node)
        if not members:
            del self.groups[old]
        members = self.groups.setdefault(node.state(), [])
        insort(members, node, key=lambda n: n.position)

    @staticmethod
    def memory_on(job: JobRequest, node: _Node, i: int) -> int:
        if job.gpu_memory_mib is not None:
            return job.gpu_memory_mib
        milli = job.gpu_milli if job.gpus == 1 else WHOLE
        return -(-node.gpus[i].memory_mib * milli // WHOLE)

    def options(self, job: JobRequest, node: _Node, cpu: int, memory: int) -> list[tuple[int, ...]]:
        """Ways to place the job on this node (GPU indexes), one per distinct GPU state."""
        if cpu > node.cpu or memory > node.host_memory:
            return []
        allowed = [i for i, g in enumerate(node.gpus)
                   if (not job.gpu_models or g.model in job.gpu_models) and self.memory_on(job, node, i) <= g.memory_mib]
        if job.gpus == 1:
            seen, out = set(), []
            for i in allowed:
                state = (node.free[i], node.memory[i], node.gpus[i].model)
                if node.free[i] >= job.gpu_milli and node.memory[i] >= self.memory_on(job, node, i) and state not in seen:
                    seen.add(state)
                    out.append((i,))
            return out
        empty = [i for i in allowed if node.free[i] >= WHOLE]
        return [tuple(empty[: job.gpus])] if len(empty) >= job.gpus else []

    def take(self, job: JobRequest, node: _Node, chosen: list[int], cpu: float, memory: float) -> NodeSlice:
        milli = job.gpu_milli if job.gpus == 1 else WHOLE
        old = node.state()
        for i in chosen:
            node.free[i] -= milli
            node.memory[i] -= self.memory_on(job, node, i)
        node.cpu -= cpu
        node.host_memory -= memory
        node.key = None
        node.most = max(node.free)
        self._regroup(node, old)
        return NodeSlice(node=node.name, gpu_ids=tuple(node.gpus[i].id for i in chosen),
                         gpu_indices=tuple(node.gpus[i].index for i in chosen))

    def spread(self, job: JobRequest) -> Place | None:
        """A gang wider than any node: whole free GPUs, most-free nodes first."""
        per_node = []
        for node in self.nodes:
            empty = [i for i, g in enumerate(node.gpus) if node.free[i] >= WHOLE
                     and (not job.gpu_models or g.model in job.gpu_models) and self.memory_on(job, node, i) <= g.memory_mib]
            if empty:
                per_node.append((-len(empty), node.name, node, empty))
        per_node.sort(key=lambda entry: entry[:2])
        if sum(len(e[3]) for e in per_node) < job.gpus:
            return None
        plan, covered = [], 0
        for _, _, node, empty in per_node:
            chosen = empty[: job.gpus - covered]
            plan.append((node, chosen))
            covered += len(chosen)
            if covered == job.gpus:
                break
        shares = [len(c) / job.gpus for _, c in plan]
        if any(job_cpu(job) * s > node.cpu or job_memory(job) * s > node.host_memory for (node, _), s in zip(plan, shares)):
            return None
        slices = []
        first = 0
        for rank, ((node, chosen), share) in enumerate(zip(plan, shares)):
            piece = self.take(job, node, chosen, job_cpu(job) * share, job_memory(job) * share)
            slices.append(NodeSlice(node=piece.node, gpu_ids=piece.gpu_ids, gpu_indices=piece.gpu_indices,
                                    node_rank=rank, first_rank=first))
            first += len(chosen)
        return Place(job_id=job.id, slices=tuple(slices))


def job_cpu(job) -> int:
    return job.cpu_milli


def job_memory(job) -> int:
    return job.host_memory_mb


def _free_share(node: _Node, chosen: list[int], milli: int) -> float:
    return (sum(max(0, f) for f in node.free) - milli * len(chosen)) / (WHOLE * node.gpu_count)


def _best_fit(job, node, chosen, cpu, memory, workload) -> tuple:
    milli = job.gpu_milli if job.gpus == 1 else WHOLE
    cpu_left = (node.cpu - cpu) / node.cpu_cap if node.cpu_cap else 0.0
    # Tightest GPU inside the node: least free share left on the chosen GPUs.
    return (_free_share(node, chosen, milli) + cpu_left, sum(node.free[i] for i in chosen))


def _gpu_packing(job, node, chosen, cpu, memory, workload) -> tuple:
    milli = job.gpu_milli if job.gpus == 1 else WHOLE
    if any(0 < node.free[i] < WHOLE for i in chosen):
        tier = 0  # joins a GPU already partly allocated
    elif any(f < WHOLE for f in node.free):
        tier = 1  # a node with allocated GPUs
    else:
        tier = 2
    return (tier, sum(node.free[i] for i in chosen), _free_share(node, chosen, milli))


def _fgd(job, node, chosen, cpu, memory, workload) -> tuple:
    milli = job.gpu_milli if job.gpus == 1 else WHOLE
    before = workload.node(node.model, tuple(max(0, f) for f in node.free), node.cpu, node.host_memory)
    after_free = list(node.free)
    for i in chosen:
        after_free[i] -= milli
    after = workload.node(node.model, tuple(max(0, f) for f in after_free), node.cpu - cpu, node.host_memory - memory)
    return (after - before, sum(node.free[i] for i in chosen))


def _first(job, node, chosen, cpu, memory, workload) -> tuple:
    return ()


# (policy, workload, node state, request shape) -> the node's best (score, GPU indexes) or None.
# Scores are functions of these alone, so the memo holds across cycles and replays.
_MEMO: dict[tuple, tuple | None] = {}
_MEMO_LIMIT = 2_000_000
_WORKLOADS: dict[tuple, Workload] = {}


def _workload(snapshot: ClusterSnapshot) -> tuple[tuple, Workload]:
    """FGD's target workload from the snapshot's requests, popularity rounded to a thousandth so
    that consecutive cycles of a steady workload share one (and its memo)."""
    exact = Workload.of([*snapshot.pending, *_as_requests(snapshot)])
    key = tuple((c.gpus, c.milli, c.models, c.cpu_milli, c.host_memory_mb, round(c.popularity, 3))
                for c in exact.classes)
    workload = _WORKLOADS.get(key)
    if workload is None:
        if len(_WORKLOADS) > 64:
            _WORKLOADS.clear()
        workload = _WORKLOADS[key] = Workload([TaskClass(*entry) for entry in key])
    return key, workload


def _policy(score, name: str, needs_workload: bool = False, randomised: bool = False):
    def policy(snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
        cluster = Cluster(snapshot)
        workload_key, workload = _workload(snapshot) if needs_workload else ((), None)
        if len(_MEMO) > _MEMO_LIMIT:
            _MEMO.clear()
        placements, pending = [], []
        # Free resources only shrink within a cycle: a request at least as large as one that
        # found no node (same width, models and memory) finds none either.
        failed: dict[tuple, list[tuple[int, int, int]]] = {}
        for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.submitted_at, j.id)):
            if job.gpus < 1:
                pending.append(Pending(job.id, PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, "CPU-only work is not placed here.")))
                continue
            cpu, memory = job_cpu(job), job_memory(job)
            family = (job.gpus, job.gpu_models, job.gpu_memory_mib)
            point = (job.gpu_milli, cpu, memory)
            if any(f[0] <= point[0] and f[1] <= point[1] and f[2] <= point[2] for f in failed.get(family, ())):
                pending.append(Pending(job.id, _NO_ROOM))
                continue
            milli = job.gpu_milli if job.gpus == 1 else WHOLE
            shape = (name, workload_key, job.gpus, job.gpu_milli, job.gpu_models, job.gpu_memory_mib, cpu, memory)
            best, feasible, feasible_nodes = None, [], 0
            for state, members in cluster.groups.items():
                node = members[0]
                if node.gpu_count < job.gpus or cpu > node.cpu or memory > node.host_memory:
                    continue
                if job.gpus == 1:
                    if node.most < milli:
                        continue
                elif node.free.count(WHOLE) < job.gpus:
                    continue
                memo_key = (node.state(), shape)
                found = _MEMO.get(memo_key, _MEMO)
                if found is _MEMO:
                    found = None
                    for chosen in cluster.options(job, node, cpu, memory):
                        mine = (score(job, node, chosen, cpu, memory, workload), chosen)
                        if found is None or mine[0] < found[0]:
                            found = mine
                    _MEMO[memo_key] = found
                if found is None:
                    continue
                if randomised:
                    feasible.append((members, found[1]))
                    feasible_nodes += len(members)
                elif best is None or (found[0], node.position) < best[0]:
                    best = ((found[0], node.position), node, found[1])
            if feasible:
                # Uniform over feasible nodes: a group weighs as many nodes as it holds.
                pick = random.Random(job.id).randrange(feasible_nodes)
                for members, chosen in feasible:
                    if pick < len(members):
                        best = ((), members[pick], chosen)
                        break
                    pick -= len(members)
            if best is not None:
                _, node, chosen = best
                placements.append(Place(job_id=job.id, slices=(cluster.take(job, node, list(chosen), cpu, memory),)))
                continue
            spread = cluster.spread(job) if job.gpus > max((n.gpu_count for n in cluster.nodes), default=0) else None
            if spread is not None:
                placements.append(spread)
                continue
            frontier = failed.setdefault(family, [])
            # Keep the smallest failures only: a larger one is implied by a smaller one.
            frontier[:] = [f for f in frontier if not (f[0] >= point[0] and f[1] >= point[1] and f[2] >= point[2])]
            frontier.append(point)
            pending.append(Pending(job.id, _NO_ROOM))
        return Decisions(placements=tuple(placements), pending=tuple(pending))

    policy.__name__ = policy.__qualname__ = name
    return policy


_NO_ROOM = PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS,
                         "No node has room for the job's GPU share together with its CPU and memory.")


class _Running:
    __slots__ = ("gpus", "gpu_milli", "gpu_models", "cpu_milli", "host_memory_mb")

    def __init__(self, job):
        self.gpus, self.gpu_milli, self.gpu_models = len(job.gpu_ids), job.gpu_milli, frozenset()
        self.cpu_milli, self.host_memory_mb = job_cpu(job), job_memory(job)


def _as_requests(snapshot: ClusterSnapshot) -> list[_Running]:
    return [_Running(job) for job in snapshot.running]


random_fit = _policy(_first, "random_fit", randomised=True)
best_fit = _policy(_best_fit, "best_fit")
gpu_packing = _policy(_gpu_packing, "gpu_packing")
fgd = _policy(_fgd, "fgd", needs_workload=True)
