"""Finding GPUs for one job on the cycle's ``Capacity``: filters and best-fit scores.

Rules (DESIGN.md "Packing" and "Gang + topology"):

* A job's per-GPU memory is its recorded profile's peak (Nimble) when it has one, else its
  request, else the GPU's memory in proportion to ``gpu_milli`` (a whole GPU for whole requests).
* Only one-GPU jobs share a GPU. A gang takes empty GPUs: in a ring all-reduce the slowest rank
  paces every other one, so one shared GPU slows the whole gang.
* A one-GPU job goes, in this order: (1) beside residents whose requests leave room for its own
  (a fraction packing with fractions: nothing promised twice), or (2) on an empty GPU, the two
  ranked together by the score (``fragmentation_score``: FGD's gradient, then the least room
  left, the fullest node, the tightest memory); only when neither exists (3) it over-commits: a
  borrower joins a GPU whose residents' requests fill it but whose live load leaves spare compute
  for its demand (or at least ``min_shared_room_milli``: it runs on what is spare, throttled if a
  guaranteed neighbour suffers), tightest memory fit first. Over-commit costs every job on the GPU
  speed, an empty GPU costs nobody anything now (its owner reclaims it when needed). Memory +
  headroom must fit throughout (no headroom for a fraction whose memory is just its share: that
  share is also its limit). ``SchedulerConfig.placement_score = "tightest"`` drops the gradient
  (``NoScore``): the same candidates in the same order, ranked by the tie-breaks alone.
* A gang on one node takes the node with the cheapest all-reduce, then the lowest gradient, then
  the least left over (GPU and CPU share, BestFit's measure), across GPU models too.
* A guaranteed job never joins another guaranteed job unless both allow sharing (``shareable``
  or fractional), and then only while their guaranteed milli-GPUs sum to at most one GPU. A
  non-shareable guaranteed job prefers an empty GPU; failing that it may sit next to
  opportunistic work whose memory leaves room (that work is then throttled).
* Nodes reserved for a blocked gang are only offered to jobs allowed to backfill there.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from jobs.scheduling.capacity import ROOM_BUCKETS, ROOM_STEP, Capacity, GpuSlot, NodeSlot
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling import filters
from jobs.scheduling.filters import compute_room, host_resources
from jobs.scheduling.fragmentation_score import leftover
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobClass, JobRequest
from jobs.scheduling.topology import Candidate, allreduce_seconds, choose_nodes, slowest_link


# GPUs looked at in the one room bucket that may or may not have room for a request; past this
# the search moves on: at worst a looser fit or a job that waits a cycle, never an unsafe placement.
PARTIAL_BUCKET_SCAN = 8
# Candidates a score ranks, per index bucket (GPUs with request room, nodes with k empty GPUs):
# enough to see the different states a bucket holds, bounded so a search stays cheap.
SCORED_PER_BUCKET = 16


@dataclass(slots=True, eq=False)
class Shape:
    """What placement needs to know about a request. The cycle interns one Shape per distinct
    request, so shapes compare and hash by identity (cheap memo keys); treat it as read-only."""

    gpus: int
    gpu_milli: int
    memory_mib: int | None  # None: proportional to the GPU's memory
    demand_milli: int
    models: frozenset[str]
    max_nodes: int | None
    shareable: bool
    allreduce_bytes: int
    needs_runtime: bool = False
    # Per GPU, of the node that hosts it (``filters.host_resources``); 0: none asked.
    cpu_per_gpu: int = 0
    host_mb_per_gpu: int = 0
    mig_profile: str | None = None
    accepts_unfenced: bool = True
    # Margin kept free next to the request on a shared GPU, for memory that grows past what was
    # planned. None for a fraction that gave no memory: its memory is its share of the GPU, which
    # is also its enforced limit, so two halves fit one GPU exactly.
    headroom_mib: int = 0

    @property
    def needs_host(self) -> bool:
        return bool(self.cpu_per_gpu or self.host_mb_per_gpu)

    def memory_on(self, capacity_mib: int) -> int:
        if self.memory_mib is not None:
            return self.memory_mib
        # Rounded down: fractions whose requests add up to the GPU must fit in its memory too.
        return capacity_mib * self.gpu_milli // WHOLE_GPU_MILLI


def shape_of(job: JobRequest, config: SchedulerConfig) -> Shape:
    memory = job.profile.peak_memory_mib if job.profile else job.gpu_memory_mib
    if job.profile:
        demand = min(job.gpu_milli, round(job.profile.mean_utilisation * WHOLE_GPU_MILLI))
    else:
        demand = job.gpu_milli
    return Shape(gpus=job.gpus, gpu_milli=job.gpu_milli, memory_mib=memory, demand_milli=demand,
                 models=job.gpu_models, max_nodes=job.max_nodes,
                 shareable=job.shareable or job.gpu_milli < WHOLE_GPU_MILLI,
                 allreduce_bytes=job.allreduce_bytes or config.default_allreduce_bytes,
                 needs_runtime=job.needs_runtime,
                 cpu_per_gpu=host_resources.per_gpu(job.cpu_milli, job.gpus),
                 host_mb_per_gpu=host_resources.per_gpu(job.host_memory_mb, job.gpus),
                 mig_profile=job.mig_profile, accepts_unfenced=job.accepts_unfenced,
                 headroom_mib=0 if memory is None and job.fractional else config.share_memory_headroom_mib)


class FailureMemo:
    """Requests known to find nothing this cycle. Capacity only shrinks within a cycle and a
    request needing at least as much memory, compute, quota, CPU and host memory as a failed one
    (same GPU count, models and sharing terms) fails too, so one failure answers a whole family."""

    def __init__(self):
        self._frontiers: dict[object, dict[tuple, list[tuple[int, ...]]]] = {}
        self._split: dict[Shape, tuple[tuple, tuple[int, ...]]] = {}

    def _family(self, shape: Shape) -> tuple[tuple, tuple[int, int, int]]:
        found = self._split.get(shape)
        if found is None:
            found = self._split[shape] = (
                (shape.gpus, shape.models, shape.max_nodes, shape.shareable, shape.memory_mib is None,
                 shape.needs_runtime, shape.mig_profile, shape.accepts_unfenced),
                (shape.memory_mib or 0, shape.demand_milli, shape.gpu_milli, shape.cpu_per_gpu,
                 shape.host_mb_per_gpu),
            )
        return found

    def fails(self, tag, shape: Shape) -> bool:
        by_family = self._frontiers.get(tag)
        if not by_family:
            return False
        family, (memory, demand, milli, cpu, host) = self._family(shape)
        for failed in by_family.get(family, ()):
            # (spelled out: a generator per comparison was most of the cost of a failed cycle's misses)
            if (memory >= failed[0] and demand >= failed[1] and milli >= failed[2] and cpu >= failed[3]
                    and host >= failed[4]):
                return True
        return False

    def record(self, tag, shape: Shape) -> None:
        family, point = self._family(shape)
        frontier = self._frontiers.setdefault(tag, {}).setdefault(family, [])
        # Keep only the easiest failures: a harder one is implied by an easier one.
        frontier[:] = [f for f in frontier if not all(theirs >= mine for theirs, mine in zip(f, point))]
        frontier.append(point)


@dataclass(slots=True)
class Choice:
    slices: list[Candidate]
    memory_mib: list[int]  # per chosen GPU, in slice order
    shared: bool  # lands on a GPU that already has residents
    allreduce_s: float


@dataclass(frozen=True, slots=True)
class OneNodeWait:
    """What ``GpuSearch.find`` returns for a young gang that could only be spread: wait instead."""

    spread_nodes: int


class NoScore:
    """The score that ranks nothing: candidates go by the tie-breaks alone (least room left, the
    fullest node, BestFit's leftover, the tightest memory). ``placement_score = "tightest"``."""

    name = "tightest"

    @staticmethod
    def delta(node, gpus, shape) -> float:
        return 0.0


class Placer:
    def __init__(self, capacity: Capacity, config: SchedulerConfig, score=None):
        self.capacity = capacity
        self.config = config
        # Ranks the candidates of a one-GPU job and of a gang on one node (``fragmentation_score``).
        self.score = NoScore() if score is None else score
        self._pools: dict[tuple, list[int]] = {}
        self._pools_by_shape: dict[Shape, list[int]] = {}

    def pools_for(self, shape: Shape) -> list[int]:
        """The index pools whose GPUs the pool filters admit for this request."""
        pools = self._pools_by_shape.get(shape)
        if pools is None:
            key = filters.pool_key(shape)
            pools = self._pools.get(key)
            if pools is None:
                pools = self._pools[key] = [
                    i for i, pool in enumerate(self.capacity.pools) if filters.admits_pool(pool, shape)]
            self._pools_by_shape[shape] = pools
        return pools

    def room_needed(self, shape: Shape) -> int:
        return compute_room.room_needed(shape, self.config.min_shared_room_milli)

    # -- the one-GPU predicate (indexes accelerate it; backfill and mixed nodes use it) -----------

    def fits_gpu(self, gpu: GpuSlot, shape: Shape, job_class: JobClass, pools: list[int]) -> bool:
        if gpu.blocked or gpu.pool not in pools:  # (pools: the pool filters' verdict)
            return False
        if shape.needs_host and filters.gpus_on(gpu.node, shape) < 1:
            return False
        return gpu.occupants == 0 or filters.admits_shared_gpu(gpu, shape, job_class, self.config)

    # -- search ---------------------------------------------------------------------------------

    def find(self, shape: Shape, job_class: JobClass, backfill: list[NodeSlot], spread: bool = True) -> Choice | None:
        """``spread=False``: a gang only on one node (it is waiting for one rather than spreading)."""
        pools = self.pools_for(shape)
        if not pools:
            return None
        if shape.gpus == 1:
            return self._one_gpu(shape, job_class, pools, backfill)
        return self._gang(shape, pools, backfill, spread)

    def on_gpus(self, gpus: list[GpuSlot], shape: Shape, job_class: JobClass) -> Choice | None:
        """The job on exactly ``gpus`` (freed for it by a reclaim), if they take it now: the rules
        of a search, applied to one answer."""
        pools = self.pools_for(shape)
        if len(gpus) != shape.gpus or len(set(gpus)) != len(gpus) or not all(g.node.indexed for g in gpus):
            return None
        if shape.gpus == 1:
            gpu = gpus[0]
            if not self.fits_gpu(gpu, shape, job_class, pools):
                return None
            return self._single(gpu, shape, shared=bool(gpu.occupants))
        if any(g.occupants or g.blocked or g.pool not in pools for g in gpus) or not self.one_model(gpus):
            return None  # a gang takes empty GPUs of one model
        by_node: dict[int, tuple[NodeSlot, list[GpuSlot]]] = {}
        for gpu in sorted(gpus, key=lambda g: g.key):
            by_node.setdefault(gpu.node.key, (gpu.node, []))[1].append(gpu)
        if shape.max_nodes is not None and len(by_node) > shape.max_nodes:
            return None
        if shape.needs_host and any(filters.gpus_on(node, shape) < len(mine) for node, mine in by_node.values()):
            return None
        # Largest share first, as a search orders them (the first node hosts the rendezvous).
        return self._gang_choice(sorted(by_node.values(), key=lambda slice_: (-len(slice_[1]), slice_[0].key)), shape)

    def fits_on(self, nodes: list[NodeSlot], shape: Shape, job_class: JobClass) -> bool:
        """Would the job fit on these nodes alone (ignoring that they are held)?"""
        pools = self.pools_for(shape)
        if shape.gpus == 1:
            return any(self.fits_gpu(g, shape, job_class, pools) for node in nodes for g in node.gpus)
        usable = [min(sum(1 for g in node.empty if g.pool in pools), filters.gpus_on(node, shape)) for node in nodes]
        if shape.max_nodes == 1:
            return max(usable, default=0) >= shape.gpus
        return sum(usable) >= shape.gpus

    def _one_gpu(self, shape: Shape, job_class: JobClass, pools: list[int], backfill: list[NodeSlot]) -> Choice | None:
        # Within requests first (a fraction beside fractions that leave it room: no GPU promised
        # twice), then an empty GPU, and only then over-commit (a borrower on a GPU whose residents'
        # requests fill it but whose measured load leaves room, or a guaranteed job beside
        # borrowers): over-commit costs every job on the GPU speed, an empty GPU costs nothing now.
        packs = shape.gpu_milli < WHOLE_GPU_MILLI and (job_class is JobClass.OPPORTUNISTIC or shape.shareable)
        scored = self._scored(shape, job_class, pools, backfill, packs)
        if scored is not None:
            return self._single(scored, shape, shared=bool(scored.occupants))
        shared = self._shared_gpu(shape, job_class, pools, backfill)
        return None if shared is None else self._single(shared, shape, shared=True)

    def _scored(self, shape: Shape, job_class: JobClass, pools: list[int], backfill: list[NodeSlot],
                packs: bool) -> GpuSlot | None:
        """The candidate the score ranks best: GPUs whose residents' requests leave room (when the
        job packs), and an empty GPU on each of the first nodes of every empty-count bucket. Ties:
        the least room left on the GPU, the fullest node, BestFit's leftover, the tightest memory."""
        gpus, milli, fits, delta = self.capacity.gpus, shape.gpu_milli, self.fits_gpu, self.score.delta
        best: tuple | None = None
        if packs:
            for pool in pools:
                need = shape.memory_on(self.capacity.pools[pool].memory_mib) + shape.headroom_mib
                for bucket in self.capacity.req_index[pool][milli // ROOM_STEP:]:
                    taken = 0
                    for position in range(bisect_left(bucket, (need, -1)), len(bucket)):
                        gpu = gpus[bucket[position][1]]
                        left = WHOLE_GPU_MILLI - gpu.requested_milli - milli
                        if left < 0 or not fits(gpu, shape, job_class, pools):
                            continue
                        option = (delta(gpu.node, (gpu,), shape), left, len(gpu.node.empty),
                                  leftover(gpu.node, (gpu,), shape), bucket[position][0] - need, gpu.key)
                        if best is None or option < best:
                            best = option
                        taken += 1
                        if taken == SCORED_PER_BUCKET:
                            break
            for node in backfill:
                for gpu in node.gpus:
                    left = WHOLE_GPU_MILLI - gpu.requested_milli - milli
                    if gpu.occupants and left >= 0 and fits(gpu, shape, job_class, pools):
                        option = (delta(node, (gpu,), shape), left, len(node.empty), leftover(node, (gpu,), shape),
                                  gpu.free_mib - shape.memory_on(gpu.capacity_mib), gpu.key)
                        if best is None or option < best:
                            best = option
        nodes = self.capacity.nodes
        for pool in pools:
            for k, bucket in enumerate(self.capacity.buckets[pool]):
                if not k or not bucket:
                    continue
                taken = 0
                for node_key in bucket:
                    node = nodes[node_key]
                    if shape.needs_host and filters.gpus_on(node, shape) < 1:
                        continue
                    gpu = node.empty[0]
                    option = (delta(node, (gpu,), shape), WHOLE_GPU_MILLI - milli, k, leftover(node, (gpu,), shape),
                              gpu.capacity_mib - shape.memory_on(gpu.capacity_mib), gpu.key)
                    if best is None or option < best:
                        best = option
                    taken += 1
                    if taken == SCORED_PER_BUCKET:
                        break
        for node in self.capacity.mixed_nodes + backfill:
            usable = [g for g in node.empty if g.pool in pools]
            if usable and filters.gpus_on(node, shape) >= 1:
                option = (delta(node, usable[:1], shape), WHOLE_GPU_MILLI - milli, len(node.empty),
                          leftover(node, usable[:1], shape),
                          usable[0].capacity_mib - shape.memory_on(usable[0].capacity_mib), usable[0].key)
                if best is None or option < best:
                    best = option
        return None if best is None else gpus[best[-1]]

    def _single(self, gpu: GpuSlot, shape: Shape, shared: bool) -> Choice:
        return Choice([(gpu.node, [gpu])], [shape.memory_on(gpu.capacity_mib)], shared, 0.0)

    def _shared_gpu(self, shape: Shape, job_class: JobClass, pools: list[int],
                    backfill: list[NodeSlot]) -> GpuSlot | None:
        """The GPU with residents where the job fits tightest (least free memory left over)."""
        if job_class is JobClass.OPPORTUNISTIC:
            indexes, room = self.capacity.opp_index, self.room_needed(shape)
        elif shape.shareable:
            indexes, room = self.capacity.guar_index, shape.gpu_milli
        else:  # a non-shareable guaranteed job only joins GPUs without guaranteed residents
            indexes, room = self.capacity.guar_index, WHOLE_GPU_MILLI
        gpus = self.capacity.gpus
        best: tuple[int, int] | None = None
        # Buckets at or above ``whole`` have room for the job by construction (their first entry
        # with enough memory is their tightest fit); the bucket just below may, so it is scanned
        # briefly, after the others, when a fit to beat is already known.
        whole = -(-room // ROOM_STEP)
        for pool in pools:
            need = shape.memory_on(self.capacity.pools[pool].memory_mib) + shape.headroom_mib
            buckets = indexes[pool]
            for bucket_no in [*range(whole, ROOM_BUCKETS), *([whole - 1] if whole else [])]:
                bucket = buckets[bucket_no]
                if not bucket:
                    continue
                start = bisect_left(bucket, (need, -1))
                stop = len(bucket)
                if bucket_no < whole and start + PARTIAL_BUCKET_SCAN < stop:
                    stop = start + PARTIAL_BUCKET_SCAN
                for position in range(start, stop):
                    free, key = bucket[position]
                    if best is not None and free - need >= best[0]:
                        break
                    if self.fits_gpu(gpus[key], shape, job_class, pools):
                        best = (free - need, key)
                        break
        for node in backfill:
            for gpu in node.gpus:
                if gpu.occupants and self.fits_gpu(gpu, shape, job_class, pools):
                    slack = gpu.free_mib - shape.memory_on(gpu.capacity_mib) - shape.headroom_mib
                    if best is None or (slack, gpu.key) < best:
                        best = (slack, gpu.key)
        return None if best is None else gpus[best[1]]

    def one_model(self, gpus: list[GpuSlot]) -> bool:
        """Are ``gpus`` all of one model (as a gang's must be)?"""
        return len({self.capacity.pools[gpu.pool].model for gpu in gpus}) == 1

    def pools_by_model(self, pools: list[int]) -> list[list[int]]:
        """``pools`` grouped by GPU model, in first-seen order."""
        by_model: dict[str, list[int]] = {}
        for pool in pools:
            by_model.setdefault(self.capacity.pools[pool].model, []).append(pool)
        return list(by_model.values())

    def _gang(self, shape: Shape, pools: list[int], backfill: list[NodeSlot], spread: bool = True) -> Choice | None:
        """A gang runs on GPUs of one model: its ranks move in lockstep, so one slower model holds
        every rank back (a review found a gang of 6 V100s and 2 A100s). Each model that fits is
        searched on its own; fewest nodes win, then the cheaper all-reduce."""
        best: tuple | None = None
        for model_pools in self.pools_by_model(pools):
            choice = self._gang_of_one_model(shape, model_pools, backfill, spread)
            if choice is not None:
                option = (len(choice.slices), choice.allreduce_s, self._gang_score(choice, shape))
                if best is None or option < best[0]:
                    best = (option, choice)
        return None if best is None else best[1]

    def _gang_score(self, choice: Choice, shape: Shape) -> tuple[float, float]:
        """The score of a one-node gang placement and its tie-break (0s over several nodes)."""
        if len(choice.slices) != 1:
            return 0.0, 0.0
        node, gpus = choice.slices[0]
        return self.score.delta(node, gpus, shape), leftover(node, gpus, shape)

    def _gang_of_one_model(self, shape: Shape, pools: list[int], backfill: list[NodeSlot],
                           spread: bool = True) -> Choice | None:
        single = self._gang_one_node(shape, pools, backfill)
        if single is not None:
            return single
        if shape.max_nodes == 1 or not spread:
            return None
        candidates = self._gang_candidates(pools, backfill, shape)
        choice = choose_nodes(candidates, shape.gpus, shape.allreduce_bytes, self.config)
        if choice is None or (shape.max_nodes is not None and len(choice) > shape.max_nodes):
            return None
        return self._gang_choice(choice, shape)

    def _gang_one_node(self, shape: Shape, pools: list[int], backfill: list[NodeSlot]) -> Choice | None:
        """The node whose all-reduce is cheapest, then the one the score ranks best, among the
        first nodes of every empty-count bucket that holds the gang (``pools``: one model's); ties:
        BestFit's leftover, then the tightest memory."""
        n, delta, nodes = shape.gpus, self.score.delta, self.capacity.nodes
        best: tuple | None = None
        best_gpus: list[GpuSlot] | None = None
        for pool in pools:
            memory, gb_per_s = self.capacity.pools[pool].memory_mib, self.capacity.pools[pool].gb_per_s
            buckets = self.capacity.buckets[pool]
            cost = allreduce_seconds(n, shape.allreduce_bytes, gb_per_s)
            slack = memory - shape.memory_on(memory)
            for k in range(n, len(buckets)):
                taken = 0
                for node_key in buckets[k]:
                    node = nodes[node_key]
                    if shape.needs_host and filters.gpus_on(node, shape) < n:
                        continue
                    usable = node.empty[:n]
                    option = (cost, delta(node, usable, shape), leftover(node, usable, shape), slack, node_key)
                    if best is None or option < best:
                        best, best_gpus = option, usable
                    taken += 1
                    if taken == SCORED_PER_BUCKET:
                        break
        for node in self.capacity.mixed_nodes + backfill:
            usable = [g for g in node.empty if g.pool in pools][:n]
            if len(usable) == n and filters.gpus_on(node, shape) >= n:
                option = (allreduce_seconds(n, shape.allreduce_bytes, node.gb_per_s), delta(node, usable, shape),
                          leftover(node, usable, shape), 0, node.key)
                if best is None or option < best:
                    best, best_gpus = option, usable
        if best_gpus is None:
            return None
        return self._gang_choice([(nodes[best[-1]], best_gpus)], shape)

    def _gang_candidates(self, pools: list[int], backfill: list[NodeSlot], shape: Shape) -> list[Candidate]:
        candidates: list[Candidate] = []
        for pool in pools:
            for bucket in self.capacity.buckets[pool][1:]:
                candidates.extend((self.capacity.nodes[key], self.capacity.nodes[key].empty) for key in bucket)
        for node in self.capacity.mixed_nodes + backfill:
            usable = [g for g in node.empty if g.pool in pools]
            if usable:
                candidates.append((node, usable))
        if shape.needs_host:  # a node offers only as many GPUs as its CPU and host memory can feed
            candidates = [(node, gpus[:allowed]) for node, gpus in candidates
                          if (allowed := filters.gpus_on(node, shape)) > 0]
        return candidates

    def _gang_choice(self, choice: list[Candidate], shape: Shape) -> Choice:
        gpus = [g for _, node_gpus in choice for g in node_gpus]
        cost = allreduce_seconds(shape.gpus, shape.allreduce_bytes, slowest_link([n for n, _ in choice], self.config))
        return Choice([(n, list(g)) for n, g in choice], [shape.memory_on(g.capacity_mib) for g in gpus], False, cost)
