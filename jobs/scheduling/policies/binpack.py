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

``Protocol`` (each policy's ``fgd_protocol(typical, seed)``) is the same baseline as FGD's own
simulator runs it in its fill protocol (``hkust-adsl/kubernetes-scheduler-simulator``), for the
fill replay (``simulate.fill``) to land on FGD's published curves:

* node scores are FGD's integer plugin scores (``pkg/simulator/plugin/*_score.go``); a tie
  between nodes goes to the first of them in node order (``first_on_tie``, below), except for
  Random, whose random score makes its draw uniform (a seeded generator): BestFit
  ``int(100 (1 - sum_r 0.5 (free_r - req_r) / maxSpec_r))`` over CPU and the
  node's total free GPU (maxSpec 128 CPUs, 8 GPUs: absolute, not a share of the node); GPU
  packing's three tiers (a partly used GPU, then a used node's free GPU, then an idle node, fewer
  GPUs first), ``100 - free%/10`` inside the first; FGD ``int(100 sigmoid(dF/1000))`` with F the
  fragmentation against FGD's typical pods (fixed, from the original pod list); Random: a node
  uniformly among the feasible;
* the GPU inside the node is Open-Gpu-Share's ``gpuSelMethod``: the tightest that fits
  ("best", BestFit and GPU packing), a uniformly random one that fits (Random), the one with the
  best FGD score (FGD); whole GPUs are the first free ones by index;
* CPU-only pods are scored by the same plugin (FGD's filter lets them onto any node with CPU and
  memory) and come back as a ``Place`` with no GPU (the fill driver runs them);
* no GPU-memory constraint (FGD's openb runs have none: a GPU holds 1000 milli of requests) and
  no gang spread over nodes (FGD places a pod on one node or fails it).

Why ties go to the first node. FGD's simulator builds against a fork of Kubernetes
(``go.mod``: ``k8s.io/kubernetes => github.com/mental2008/kubernetes v1.20.5-minor``), and its
published curves can only come from a deterministic tie-break: FGD's gradient scores a whole-GPU
pod the same (53) on almost every node, since the pod changes no typical pod's fragments, so a
uniform draw (upstream ``selectHost``) spreads whole-GPU pods over the cluster, leaves no empty
8-GPU node by about 60% arrived and fails the 8-GPU pods there: 90.0% allocated at 100% arrived on
the default list, against 95.2 published, where nothing fails before 90%. Taking the first tied
node in node order packs the ties instead and lands on the published curves (FGD 95.05 at 100%,
BestFit 92.7, seed 0; ``docs/scheduling-quality.md`` has the seeds). Upstream's reservoir draw
would be ``first_on_tie=False``.
"""

from __future__ import annotations

import math
import random
from bisect import insort

from jobs.scheduling.decisions import Decisions, NodeSlice, Pending, Place
from jobs.scheduling.fragmentation import WHOLE, TaskClass, Workload
from jobs.scheduling.fragmentation_score import snapshot_requests
from jobs.scheduling import reasons
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
                   if (not job.gpu_models or g.model in job.gpu_models)
                   and self.memory_on(job, node, i) <= g.memory_mib]
        if job.gpus == 1:
            seen, out = set(), []
            for i in allowed:
                state = (node.free[i], node.memory[i], node.gpus[i].model)
                if (node.free[i] >= job.gpu_milli and node.memory[i] >= self.memory_on(job, node, i)
                        and state not in seen):
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

    def take_host(self, node: _Node, cpu: float, memory: float) -> NodeSlice:
        """A CPU-only pod: CPU and host memory, no GPU."""
        old = node.state()
        node.cpu -= cpu
        node.host_memory -= memory
        node.key = None
        self._regroup(node, old)
        return NodeSlice(node=node.name, gpu_ids=(), gpu_indices=())

    def spread(self, job: JobRequest) -> Place | None:
        """A gang wider than any node: whole free GPUs, most-free nodes first."""
        per_node = []
        for node in self.nodes:
            empty = [i for i, g in enumerate(node.gpus) if node.free[i] >= WHOLE
                     and (not job.gpu_models or g.model in job.gpu_models)
                     and self.memory_on(job, node, i) <= g.memory_mib]
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
        if any(job_cpu(job) * s > node.cpu or job_memory(job) * s > node.host_memory
               for (node, _), s in zip(plan, shares)):
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
    exact = Workload.of(list(snapshot_requests(snapshot)()))
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
                pending.append(Pending(job.id, _CPU_ONLY))
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


_NO_ROOM, _CPU_ONLY = reasons.no_room_with_host(), reasons.cpu_only_not_placed()


# -- the baselines as FGD's simulator runs them ---------------------------------------------------------

MAX_SCORE = 100  # framework.MaxNodeScore
MAX_SPEC_CPU, MAX_SPEC_GPU = 128_000, 8_000  # open-gpu-share/utils/const.go: MaxSpecCpu, MaxSpecGpu
_MEMO_PER_PROTOCOL = 500_000


def _fitting(node: _Node, milli: int) -> list[int]:
    return [i for i, f in enumerate(node.free) if f >= milli]


def _first_free(node: _Node, count: int) -> tuple[int, ...]:
    """``AllocateExclusiveGpuId``: the first fully free GPUs by index."""
    return tuple([i for i, f in enumerate(node.free) if f >= WHOLE][:count])


def _tightest(node: _Node, milli: int) -> tuple[int, ...]:
    """``allocateGpuIdBasedOnBestFit``: the least free GPU that fits, the first on a tie."""
    best = None
    for i, f in enumerate(node.free):
        if f >= milli and (best is None or f < node.free[best]):
            best = i
    return (best,)


def _fgd_gpus(job, node: _Node) -> tuple[int, ...]:
    if job.gpus == 0:
        return ()
    if job.gpus == 1 and job.gpu_milli < WHOLE:
        return _tightest(node, job.gpu_milli)
    return _first_free(node, job.gpus)


def _best_fit_score(job, node: _Node, workload) -> tuple[int, tuple[int, ...]]:
    """``best_fit_score.go: getBestFitScore`` (its normalisation to 0-100 keeps the argmax)."""
    milli = job.gpu_milli if job.gpus == 1 else (WHOLE if job.gpus else 0)
    left = 0.0
    left += (node.cpu - job.cpu_milli) / MAX_SPEC_CPU * 0.5
    left += (sum(node.free) - milli * job.gpus) / MAX_SPEC_GPU * 0.5
    return int((1.0 - left) * MAX_SCORE), _fgd_gpus(job, node)


def _gpu_packing_score(job, node: _Node, workload) -> tuple[int, tuple[int, ...]]:
    """``gpu_packing_score.go: getPackingScore``."""
    if job.gpus == 0:
        return 0, ()
    milli = job.gpu_milli if job.gpus == 1 else WHOLE
    free = node.free
    fully_free = sum(1 for f in free if f == WHOLE)
    chosen = _fgd_gpus(job, node)
    if fully_free == node.gpu_count:
        return max(MAX_SCORE // 3 - fully_free, fully_free), chosen
    wanted, use, fresh = job.gpus, [], 0
    for i in sorted(range(len(free)), key=lambda i: free[i]):
        if wanted == 0:
            break
        if milli <= free[i]:
            wanted -= 1
            use.append(i)
            fresh += free[i] == WHOLE
    if fresh:
        return max(MAX_SCORE // 2 - fresh, MAX_SCORE // 3), chosen
    free_ratio = sum(free[i] * 100 // WHOLE for i in use)
    return max(MAX_SCORE - free_ratio // 10, MAX_SCORE // 2), chosen


def sigmoid_score(before: float, after: float) -> int:
    return int(1.0 / (1.0 + math.exp(-(before - after) / 1000)) * MAX_SCORE)


def _fgd_score(job, node: _Node, workload: Workload) -> tuple[int, tuple[int, ...]]:
    """``fgd_score.go: calculateGpuShareFragExtendScore``: the node's fragmentation before and
    after, against the typical pods; a share goes to the GPU that scores best (first on a tie)."""
    free = tuple(max(0, f) for f in node.free)
    before = workload.node(node.model, free, node.cpu, INF)
    cpu_after = node.cpu - job.cpu_milli
    if job.gpus == 1 and job.gpu_milli < WHOLE:
        best = None
        for i in _fitting(node, job.gpu_milli):
            after_free = list(free)
            after_free[i] -= job.gpu_milli
            score = sigmoid_score(before, workload.node(node.model, tuple(after_free), cpu_after, INF))
            if best is None or score > best[0]:
                best = (score, (i,))
        return best
    chosen = _first_free(node, job.gpus) if job.gpus else ()
    after_free = list(free)
    for i in chosen:
        after_free[i] -= WHOLE
    return sigmoid_score(before, workload.node(node.model, tuple(after_free), cpu_after, INF)), chosen


def _random_score(job, node: _Node, workload) -> tuple[int, tuple[int, ...]]:
    return 0, ()  # every feasible node ties; the GPU is drawn after the node


_PROTOCOL_SCORES = {"random_fit": _random_score, "best_fit": _best_fit_score,
                    "gpu_packing": _gpu_packing_score, "fgd": _fgd_score}


class Protocol:
    """One baseline as FGD's simulator runs it (module docstring): ``policy(snapshot, now, config)``,
    pods one after another in priority then submit order, each on the node with the highest
    integer score, a tie going to the first tied node in node order (Random: drawn with this
    instance's seeded generator). Stateful only in that generator (and a memo of scores by node
    state): a replay makes one per run."""

    def __init__(self, name: str, typical: Workload | None, seed: int, *, first_on_tie: bool | None = None):
        if name == "fgd" and typical is None:
            raise ValueError("FGD scores against a target workload: pass the typical pods")
        self.name, self.typical = name, typical
        # Random's score is itself a draw: its ties stay uniform (module docstring).
        self.first_on_tie = name != "random_fit" if first_on_tie is None else first_on_tie
        self.score = _PROTOCOL_SCORES[name]
        self.rng = random.Random(f"{name}:{seed}")
        self.memo: dict[tuple, tuple[int, tuple[int, ...]]] = {}
        self.__name__ = self.__qualname__ = name

    def __call__(self, snapshot: ClusterSnapshot, now: float, config=None) -> Decisions:
        cluster = Cluster(snapshot)
        if len(self.memo) > _MEMO_PER_PROTOCOL:
            self.memo.clear()
        placements, pending = [], []
        for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.submitted_at, j.id)):
            choice = self.choose(cluster, job)
            if choice is None:
                pending.append(Pending(job.id, _NO_ROOM))
                continue
            node, chosen = choice
            if job.gpus == 0:
                piece = cluster.take_host(node, job.cpu_milli, job.host_memory_mb)
            else:
                piece = cluster.take(job, node, list(chosen), job.cpu_milli, job.host_memory_mb)
            milli = job.gpu_milli if job.gpus == 1 else WHOLE
            placements.append(Place(job_id=job.id, slices=(piece,), gpu_milli=milli))
        return Decisions(placements=tuple(placements), pending=tuple(pending))

    def choose(self, cluster: Cluster, job: JobRequest) -> tuple[_Node, tuple[int, ...]] | None:
        """The node (and GPUs) FGD's scheduler would bind the pod to, or None (it fails)."""
        cpu, memory = job.cpu_milli, job.host_memory_mb
        milli = job.gpu_milli if job.gpus == 1 else WHOLE
        shape = (job.gpus, milli, job.gpu_models, cpu)
        best, tied, count = None, [], 0
        for state, members in cluster.groups.items():
            node = members[0]
            if cpu > node.cpu or memory > node.host_memory:
                continue
            if job.gpus:
                if node.gpu_count < job.gpus or node.most < milli:
                    continue
                if job.gpu_models and node.model not in job.gpu_models:
                    continue
                if job.gpus > 1 and node.free.count(WHOLE) < job.gpus:
                    continue
            key = (state, shape)
            found = self.memo.get(key)
            if found is None:
                found = self.memo[key] = self.score(job, node, self.typical)
            if best is None or found[0] > best:
                best, tied, count = found[0], [(members, found[1])], len(members)
            elif found[0] == best:
                tied.append((members, found[1]))
                count += len(members)
        if best is None:
            return None
        pick = 0 if self.first_on_tie else self.rng.randrange(count)
        # Groups in node order, whatever order this cycle's placements left them in: the choice
        # then lands on the same node whether the pods came in one cycle or in many.
        tied.sort(key=lambda entry: entry[0][0].position)
        for members, chosen in tied:
            if pick < len(members):
                node = members[pick]
                break
            pick -= len(members)
        if self.name == "random_fit" and job.gpus:
            if job.gpus == 1 and milli < WHOLE:
                # allocateGpuIdBasedOnRandomFit: uniform among the GPUs that fit.
                chosen = (self.rng.choice(_fitting(node, milli)),)
            else:
                chosen = _first_free(node, job.gpus)
        return node, chosen


def _protocol_of(name: str):
    def fgd_protocol(typical: Workload | None, seed: int) -> Protocol:
        return Protocol(name, typical, seed)
    return fgd_protocol


random_fit = _policy(_first, "random_fit", randomised=True)
best_fit = _policy(_best_fit, "best_fit")
gpu_packing = _policy(_gpu_packing, "gpu_packing")
fgd = _policy(_fgd, "fgd", needs_workload=True)
for _baseline in (random_fit, best_fit, gpu_packing, fgd):
    _baseline.fgd_protocol = _protocol_of(_baseline.__name__)
