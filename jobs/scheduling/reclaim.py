"""Choosing opportunistic victims on the snapshot (simulate, then apply: the service evicts).

Two ways a running job gets preempted, and never a guaranteed one:

* **Reclaim**: a guaranteed job (its tenant is within its guarantee) finds no room. GPUs are
  freed from opportunistic jobs of tenants that are *borrowing* (holding more than their own
  guarantee): a borrower's jobs are eligible while its borrowed amount is above zero, so a reclaim
  never takes a tenant's work below its own guarantee by more than the last job. On each GPU the
  youngest jobs go first (least progress lost); among GPUs and nodes, the set that loses the
  fewest GPU-seconds of progress wins (nodes are ranked by an estimate made once per cycle and the
  best ``RECLAIM_NODES_EVALUATED`` that can host the job are compared exactly). The reclaiming
  job stays pending (``RECLAIMING``) and the GPUs chosen are promised to it
  (``Decisions.promises``, kept by the service until it is placed): nothing else lands on them,
  and once the victims have stopped, a later cycle places it there before any other placement
  (``GuaranteedPass.keep_promises``).
* **Memory pressure**: a GPU holding a guaranteed job whose residents no longer fit in memory
  (live usage grew past the plan) sheds opportunistic residents, youngest first.

**Jobs that checkpoint go first.** A job that says it checkpoints (``RunningJob.checkpoints``)
resumes from its last checkpoint when requeued; one that does not loses everything it did. So
progress lost is compared as a pair (GPU-seconds of non-checkpointing jobs, GPU-seconds of
checkpointing jobs), first element first: the set of victims that throws away the least
non-checkpointing work wins, and only sets equal in that are compared on checkpointing work. On
one GPU (reclaim and memory pressure alike) checkpointing jobs leave before the others, youngest
first within each group. Without checkpointing jobs this is exactly the youngest-first,
least-progress rule above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from jobs.scheduling.capacity import Capacity, GpuSlot, NodeSlot
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.filters import exclusivity, gang_width, gpu_memory, host_resources
from jobs.scheduling.placement import Placer, Shape
from jobs.scheduling.snapshot import JobClass, RunningJob
from jobs.scheduling.topology import allreduce_seconds, choose_nodes


# Nodes evaluated exactly per reclaim, cheapest estimate first: the least progress lost among
# them wins. Bounds a reclaim to a few hundred GPU checks on a cluster of thousands.
RECLAIM_NODES_EVALUATED = 16
# Queue entries after a reclaiming job looked at for the gangs it should leave room for: the
# few its tenant's guarantee can hold next, not a 50,000-job queue per reclaim.
RECLAIM_LOOKAHEAD = 64


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang its tenant queued behind a reclaiming job: what a reclaim should leave it room for."""

    gpus: int
    pools: tuple[int, ...]  # the capacity pools its filters admit (it runs on one model of them)
    may_spread: bool  # over several nodes (of one model), when no one node has room


@dataclass(slots=True)
class Reclaim:
    gpus: list[GpuSlot]
    victims: list[RunningJob]  # new victims only; jobs already stopping are not repeated


def _memory(job: RunningJob, gpu: GpuSlot) -> int:
    return gpu.capacity_mib if job.memory_mib is None else job.memory_mib


def youngest_first(jobs: list[RunningJob]) -> list[RunningJob]:
    """Eviction order on one GPU: jobs that checkpoint first (they lose little), then the youngest."""
    return sorted(jobs, key=lambda j: (not j.checkpoints, -j.started_at, -j.id))


# Progress lost: (GPU-seconds of jobs that do not checkpoint, GPU-seconds of jobs that do).
Loss = tuple[float, float]
NO_LOSS: Loss = (0.0, 0.0)
NEVER: Loss = (math.inf, math.inf)


def total_loss(losses) -> Loss:
    lost, checkpointed = 0.0, 0.0
    for loss in losses:
        lost += loss[0]
        checkpointed += loss[1]
    return lost, checkpointed


def within_margin(loss: Loss, least: Loss, margin_s: float) -> bool:
    """Does ``loss`` lose at most ``margin_s`` more than ``least``, in all and in work that is not
    checkpointed?"""
    return loss[0] + loss[1] <= least[0] + least[1] + margin_s and loss[0] <= least[0] + margin_s


class Option(NamedTuple):
    """One GPU a reclaim could use: what evicting for it loses, and whom."""

    loss: Loss
    key: int  # the GPU's (ties: lower first)
    gpu: GpuSlot
    victims: list[RunningJob]


class Fit(NamedTuple):
    """The job on one node: its cost (progress lost, all-reduce seconds, the node's key: least
    first), the node and the options it takes."""

    cost: tuple[Loss, float, int]
    node: NodeSlot
    picked: list[Option]


# A choice to commit: the GPUs and who must leave each.
Chosen = list[tuple[GpuSlot, list[RunningJob]]]

GUARANTEED = JobClass.GUARANTEED


class Reclaimer:
    def __init__(self, capacity: Capacity, placer: Placer, config: SchedulerConfig, now: float,
                 borrowed_milli: dict[str, int], leaving: set[int], charged: dict[int, int] | None = None):
        self.capacity = capacity
        self.placer = placer
        self.config = config
        self.now = now
        self.borrowed = borrowed_milli  # per tenant: held (not stopping) minus guarantee
        # What each running job counts of its tenant's holding (``usage.charged_milli``); absent: its request.
        self.charged = {} if charged is None else charged
        self.leaving = leaving  # running jobs already told to stop
        self._node_estimates: list[tuple[NodeSlot, list[Loss]]] | None = None
        self._ranked: dict[int, list[NodeSlot]] = {}  # per GPU count, nodes by estimated cost

    def _progress(self, job: RunningJob) -> Loss:
        done = max(0.0, self.now - job.started_at) * len(job.gpu_ids)
        return (0.0, done) if job.checkpoints else (done, 0.0)

    def _stopping(self, options: list[Option]) -> bool:
        return any(j.id in self.leaving for o in options for j in o.gpu.residents)

    def _reclaims_something(self, picked: list[Option]) -> bool:
        """A choice that evicts nobody and waits for nothing stopping is no reclaim: plain
        placement already said no to it."""
        return any(o.victims for o in picked) or self._stopping(picked)

    def _loss_of(self, picked: list[Option]) -> Loss:
        """The progress the victims of ``picked`` lose, each victim counted once."""
        return total_loss(self._progress(v) for v in {v.id: v for o in picked for v in o.victims}.values())

    def _evictable(self, job: RunningJob) -> bool:
        return job.job_class is JobClass.OPPORTUNISTIC and self.borrowed.get(job.tenant, 0) > 0

    def _gpu_victims(self, gpu: GpuSlot, shape: Shape, pools: list[int]) -> tuple[Loss, list[RunningJob]] | None:
        """What must leave ``gpu`` for the job to fit there, and the progress that costs."""
        if gpu.blocked or gpu.pool not in pools or gpu.exclusive:  # (``exclusivity``: held alone)
            return None
        if gpu.occupants == 0:
            return NO_LOSS, []  # an empty GPU next to the ones being reclaimed
        leaving = [j for j in gpu.residents if j.id in self.leaving]
        evictable = youngest_first([j for j in gpu.residents if j.id not in self.leaving and self._evictable(j)])
        if not evictable and not leaving:
            return None  # nothing to reclaim here; plain placement already said no
        staying = gpu.occupants - len(leaving) - len(evictable)
        # The filters say whether anyone may stay beside the job: a gang takes empty GPUs only
        # (``gang_width``), and a request that fills the GPU's memory leaves no room (``gpu_memory``).
        if (not gang_width.admits_shared_gpu(gpu, shape, GUARANTEED, self.config)
                or gpu_memory.fills_gpu(gpu, shape)):
            if staying:
                return None
            return total_loss(self._progress(j) for j in evictable), evictable
        # Guaranteed residents stay whatever happens: the job must be let in beside them.
        if gpu.guaranteed_count and not exclusivity.admits_shared_gpu(gpu, shape, GUARANTEED, self.config):
            return None
        free = gpu.free_mib + sum(_memory(j, gpu) for j in leaving)
        victims: list[RunningJob] = []
        for job in evictable:
            if free >= gpu_memory.needed_mib(gpu, shape, beside_residents=staying + len(evictable) > len(victims)):
                break
            victims.append(job)
            free += _memory(job, gpu)
        if free < gpu_memory.needed_mib(gpu, shape, beside_residents=staying + len(evictable) > len(victims)):
            return None
        return total_loss(self._progress(j) for j in victims), victims

    def frees(self, gpus: list[GpuSlot], shape: Shape) -> bool:
        """Will the job fit on ``gpus`` once the jobs already stopping there have left, with no
        one else evicted? (A promise kept while its victims stop; the node's CPU and host memory
        are checked when it is placed there.)"""
        if len(gpus) != shape.gpus or len(set(gpus)) != len(gpus):
            return False  # the job was edited since
        if not self.placer.one_model(gpus):
            return False  # a gang runs on one model
        pools = self.placer.pools_for(shape)
        stopping = False
        for gpu in gpus:
            if not gpu.node.schedulable:
                return False  # lost or cordoned since: no use waiting there
            found = self._gpu_victims(gpu, shape, pools)
            if found is None or found[1]:
                return False
            stopping = stopping or any(job.id in self.leaving for job in gpu.residents)
        return stopping

    def _estimates(self) -> list[tuple[NodeSlot, list[Loss]]]:
        """Per node, the progress each GPU would lose if all its borrowers went, cheapest first.

        Built once per cycle and only used to decide which nodes to evaluate exactly: the exact
        evaluation sees the current budgets and promises.
        """
        if self._node_estimates is None:
            self._node_estimates = []
            for node in self.capacity.nodes:
                costs = []
                for gpu in node.gpus:
                    if gpu.exclusive or gpu.blocked:
                        continue
                    if any(j.job_class is JobClass.GUARANTEED for j in gpu.residents):
                        costs.append(NEVER)  # usable only by shareable requests
                    else:
                        costs.append(total_loss(self._progress(j) for j in gpu.residents if j.id not in self.leaving))
                if costs:
                    self._node_estimates.append((node, sorted(costs)))
        return self._node_estimates

    def find(self, job_id: int, shape: Shape, keep: list[Gang] | None = None) -> Reclaim | None:
        """GPUs to free for the job, and whom that evicts; None if no borrower can make room.
        ``keep``: the gangs its tenant queued behind it that its guarantee can still hold: among
        nodes within ``reclaim_loss_margin_s`` of the least progress lost, one where the job
        leaves as many of them room as before is tried first (:meth:`_breaks`), the least loss
        if that cannot commit."""
        pools = self.placer.pools_for(shape)
        n = shape.gpus
        ranked = self._ranked.get(n)
        if ranked is None:
            ranked = self._ranked[n] = [node for *_, node in sorted(
                (total_loss(costs[:n]), node.key, node) for node, costs in self._estimates() if len(costs) >= n)]
        candidates = [node for node in ranked if node.indexed]
        per_node = self._evaluate(candidates, shape, pools, enough=RECLAIM_NODES_EVALUATED)
        choices = self._choose(shape, per_node, keep) if per_node else []
        if not choices and n > 1 and shape.max_nodes != 1:
            # Spreading over nodes: every node's reclaimable GPUs may be needed.
            every = [node for node, _ in self._estimates() if node.indexed]
            choices = self._choose(shape, self._evaluate(every, shape, pools, enough=len(every)))
        for chosen in choices:
            reclaim = self._commit(job_id, chosen)
            if reclaim is not None:
                return reclaim
        return None

    def _evaluate(self, nodes: list[NodeSlot], shape: Shape, pools: list[int],
                  enough: int) -> list[tuple[NodeSlot, list[Option]]]:
        """Exact victims per GPU on ``nodes``, until ``enough`` nodes could host the job alone."""
        per_node: list[tuple[NodeSlot, list[Option]]] = []
        hosts = 0
        for node in nodes:
            options = []
            for gpu in self._gpus_of(node):
                found = self._gpu_victims(gpu, shape, pools)
                if found is not None:
                    options.append(Option(found[0], gpu.key, gpu, found[1]))
            if options:
                options.sort(key=lambda o: (o.loss, o.key))
                per_node.append((node, options))
                hosts += len(options) >= shape.gpus
                if hosts >= enough:
                    break
        return per_node

    def _gpus_of(self, node: NodeSlot) -> list[GpuSlot]:
        """The GPUs of ``node`` worth asking ``_gpu_victims`` about (all, here)."""
        return node.gpus

    def _choose(self, shape: Shape, per_node: list[tuple[NodeSlot, list[Option]]],
                keep: list[Gang] | None = None) -> list[Chosen]:
        """The choices to try, best first (none: no node will do): the job on one node if any
        node will do, else (a gang that may spread) over the fewest nodes of one model."""
        fits = self._one_node_fits(shape, per_node)
        if fits:
            return [_chosen(fit.picked) for fit in self._best_first(fits, per_node, keep)]
        if shape.gpus == 1 or shape.max_nodes == 1:
            return []
        spread = self._spread(shape, per_node)
        return [] if spread is None else [_chosen(spread)]

    def _one_node_fits(self, shape: Shape, per_node: list[tuple[NodeSlot, list[Option]]]) -> list[Fit]:
        """Each node whose cheapest ``shape.gpus`` options host the job and reclaim something."""
        n = shape.gpus
        fits = []
        for node, options in per_node:
            picked = options[:n]
            if len(options) < n or not self._reclaims_something(picked):
                continue
            if shape.needs_host and self._host_allows(node, shape, picked) < n:
                continue
            cost = allreduce_seconds(n, shape.allreduce_bytes, node.gb_per_s)
            fits.append(Fit((self._loss_of(picked), cost, node.key), node, picked))
        return fits

    def _best_first(self, fits: list[Fit], per_node, keep: list[Gang] | None) -> list[Fit]:
        """The fit that loses least; when it would take room the gangs in ``keep`` need and one
        within ``reclaim_loss_margin_s`` of it would not, that one first."""
        best = min(fits, key=_cost)
        if not keep:
            return [best]
        groups = self._gang_groups(per_node, keep)
        fitting = self._gangs_fitting(keep, groups)
        if not self._breaks(best.node, best.picked, keep, groups, fitting):
            return [best]
        least, margin = best.cost[0], self.config.reclaim_loss_margin_s
        kinder = [fit for fit in fits if within_margin(fit.cost[0], least, margin)
                  and not self._breaks(fit.node, fit.picked, keep, groups, fitting)]
        return [min(kinder, key=_cost), best] if kinder else [best]

    def _spread(self, shape: Shape, per_node: list[tuple[NodeSlot, list[Option]]]) -> list[Option] | None:
        """Spread over nodes, a gang still runs on GPUs of one model (see ``Placer._gang``): each
        model is tried on its own, fewest nodes then least progress lost."""
        by_key = {o.key: o for _, options in per_node for o in options}
        best = None
        for model_pools in self.placer.pools_by_model(self.placer.pools_for(shape)):
            candidates = []
            for node, options in per_node:
                mine = [o for o in options if o.gpu.pool in model_pools]
                mine = mine[: self._host_allows(node, shape, mine)]
                if mine:
                    candidates.append((node, [o.gpu for o in mine]))
            choice = choose_nodes(candidates, shape.gpus, shape.allreduce_bytes, self.config)
            if choice is None or (shape.max_nodes is not None and len(choice) > shape.max_nodes):
                continue
            picked = [by_key[gpu.key] for _, gpus in choice for gpu in gpus]
            if not self._reclaims_something(picked):
                continue
            key = (len(choice), self._loss_of(picked))
            if best is None or key < best[0]:
                best = (key, picked)
        return None if best is None else best[1]

    def _whole(self, gpu: GpuSlot) -> bool:
        """Could a gang have ``gpu``: empty, or emptied by evicting borrowers (nobody stays)?"""
        if gpu.blocked or gpu.exclusive or gpu.guaranteed_count:
            return False
        return all(j.id in self.leaving or self._evictable(j) for j in gpu.residents)

    def _gang_groups(self, per_node, keep: list[Gang]) -> dict[int, dict[int, int]]:
        """Per pool the gangs in ``keep`` may use, per node (by key), how many GPUs a gang could
        have there: every free one on a schedulable node, and the evaluated ones that evicting
        borrowers would empty (:meth:`_whole`)."""
        wanted = {pool for gang in keep for pool in gang.pools}
        groups: dict[int, dict[int, int]] = {}

        def add(gpu: GpuSlot, node: NodeSlot) -> None:
            by_node = groups.setdefault(gpu.pool, {})
            by_node[node.key] = by_node.get(node.key, 0) + 1

        for node in self.capacity.nodes:
            if node.indexed:
                for gpu in node.empty:
                    if gpu.pool in wanted and not gpu.blocked:
                        add(gpu, node)
        for node, options in per_node:
            for option in options:
                gpu = option.gpu
                if gpu.occupants and gpu.pool in wanted and self._whole(gpu):
                    add(gpu, node)
        return groups

    def _gangs_fitting(self, gangs: list[Gang], groups: dict[int, dict[int, int]]) -> int:
        """How many of ``gangs`` the GPUs in ``groups`` (per pool, per node) could hold at once:
        largest first (one that must stay on one node before one that may spread), each on the
        one node of one model of its pools it fits best, else, if it may, over nodes of one model."""
        free = {pool: dict(by_node) for pool, by_node in groups.items()}
        fitted = 0
        for gang in sorted(gangs, key=lambda g: (-g.gpus, g.may_spread, g.pools)):
            by_model: dict[str, dict[int, list[int]]] = {}  # model -> node -> its pools there
            for pool in gang.pools:
                for node, count in free.get(pool, {}).items():
                    if count > 0:
                        by_model.setdefault(self.capacity.pools[pool].model, {}).setdefault(node, []).append(pool)
            spots = sorted((sum(free[p][node] for p in node_pools), model, node)
                           for model, nodes in by_model.items() for node, node_pools in nodes.items())
            spot = next((s for s in spots if s[0] >= gang.gpus), None)
            if spot is not None:
                self._take(free, by_model[spot[1]][spot[2]], spot[2], gang.gpus)
                fitted += 1
                continue
            if not gang.may_spread:
                continue
            for model in sorted(by_model):
                nodes = by_model[model]
                if sum(free[p][node] for node, node_pools in nodes.items() for p in node_pools) >= gang.gpus:
                    left = gang.gpus
                    for node in sorted(nodes, key=lambda key: (-sum(free[p][key] for p in nodes[key]), key)):
                        left = self._take(free, nodes[node], node, left)
                        if not left:
                            break
                    fitted += 1
                    break
        return fitted

    @staticmethod
    def _take(free: dict[int, dict[int, int]], pools: list[int], node: int, want: int) -> int:
        """Take up to ``want`` GPUs of ``pools`` on ``node`` out of ``free``; what is still wanted."""
        for pool in pools:
            took = min(want, free[pool][node])
            free[pool][node] -= took
            want -= took
            if not want:
                break
        return want

    def _breaks(self, node: NodeSlot, picked: list[Option], keep: list[Gang], groups: dict[int, dict[int, int]],
                fitting: int) -> bool:
        """Would taking ``picked`` on ``node`` leave room for fewer of the gangs in ``keep`` than
        the ``fitting`` there is now (:meth:`_gang_groups`)?"""
        after = {pool: dict(by_node) for pool, by_node in groups.items()}
        touched = False
        for option in picked:
            by_node = after.get(option.gpu.pool)
            if by_node and by_node.get(node.key, 0) > 0 and self._whole(option.gpu):
                by_node[node.key] -= 1
                touched = True
        return touched and self._gangs_fitting(keep, after) < fitting

    @staticmethod
    def _host_allows(node: NodeSlot, shape: Shape, options: list[Option]) -> int:
        """GPUs of the request ``node`` can feed once the victims in ``options`` have left it
        (an upper bound for a spread gang, which may keep only some of them)."""
        if not shape.needs_host:
            return host_resources.UNLIMITED
        victims = {v.id: v for o in options for v in o.victims}.values()
        on_node = {g.id for g in node.gpus}
        freed_cpu = freed_memory = 0
        for victim in victims:
            here = sum(1 for gpu_id in victim.gpu_ids if gpu_id in on_node)
            freed_cpu += host_resources.per_gpu(victim.cpu_milli, len(victim.gpu_ids)) * here
            freed_memory += host_resources.per_gpu(victim.host_memory_mb, len(victim.gpu_ids)) * here
        return host_resources.gpus_allowed(node, shape.cpu_per_gpu, shape.host_mb_per_gpu, freed_cpu, freed_memory)

    def _commit(self, job_id: int, chosen: Chosen) -> Reclaim | None:
        victims: dict[int, RunningJob] = {}
        for _, gpu_victims in chosen:
            for victim in gpu_victims:
                victims.setdefault(victim.id, victim)
        ordered = youngest_first(list(victims.values()))
        borrowed = dict(self.borrowed)
        for victim in ordered:
            if borrowed.get(victim.tenant, 0) <= 0:
                return None  # this borrower would drop below its own guarantee
            borrowed[victim.tenant] -= self.charged.get(victim.id, victim.quota_milli)
        self.borrowed.update(borrowed)
        self.leaving.update(victims)
        for gpu, _ in chosen:
            self.capacity.block(gpu)
        return Reclaim(gpus=[gpu for gpu, _ in chosen], victims=ordered)


def _cost(fit: Fit) -> tuple:
    return fit.cost


def _chosen(picked: list[Option]) -> Chosen:
    return [(o.gpu, o.victims) for o in picked]


def memory_pressure_victims(capacity: Capacity, config: SchedulerConfig,
                            leaving: set[int]) -> list[tuple[RunningJob, int]]:
    """Opportunistic residents to evict from GPUs whose guaranteed jobs are being squeezed.

    Returns (victim, gpu id) pairs, youngest first per GPU; marks them leaving.
    """
    victims: list[tuple[RunningJob, int]] = []
    for gpu in capacity.gpus:
        if not gpu.guaranteed_count:
            continue
        # The margin placement kept when it let the residents in: squeezing must be judged by the
        # same rule, or a GPU filled exactly by shares is emptied and refilled every cycle.
        headroom = gpu.margin_mib
        if gpu.used_mib + headroom <= gpu.capacity_mib:
            continue
        used = gpu.used_mib - sum(_memory(j, gpu) for j in gpu.residents if j.id in leaving)
        borrowers = youngest_first([j for j in gpu.residents
                                     if j.job_class is JobClass.OPPORTUNISTIC and j.id not in leaving])
        for job in borrowers:
            if used + headroom <= gpu.capacity_mib:
                break
            victims.append((job, gpu.id))
            leaving.add(job.id)
            used -= _memory(job, gpu)
    return victims

