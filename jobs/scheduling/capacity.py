"""The cycle's working copy of GPU capacity, indexed so that placement never scans the cluster.

Built from the frozen snapshot and mutated as the cycle places jobs (the snapshot itself is never
touched). A caller's ``Carry`` keeps it for the next cycle, which renews it (``Capacity.renew``):
only the nodes the cycle changed, and those whose residents or readings moved since, are built
again, exactly as a new copy would have them.

Three indexes, all keyed by a *pool* (GPU model, memory, node link bandwidth, whether the node
has a container runtime), so a request's model/memory/image constraints select a handful of pools:

* ``buckets[pool][k]``: nodes with exactly k empty GPUs (whole-GPU and gang placement, best fit
  = smallest k that fits). Only nodes whose GPUs are all one pool; the rare mixed node is kept in
  ``mixed_nodes`` and scanned.
* ``opp_index[pool][room]``: GPUs with residents that can still take opportunistic work, bucketed
  by compute room (``ROOM_STEP`` milli-GPUs a bucket) and sorted by free memory within a bucket, so
  a request scans only buckets with enough room and the first entry with enough memory is the
  tightest fit of that bucket.
* ``guar_index[pool][room]``: GPUs with residents that a guaranteed job could join (no exclusive
  guaranteed resident), bucketed by unreserved guaranteed milli-GPUs, sorted by free memory.
* ``req_index[pool][room]``: GPUs with residents whose requests (every resident's milli-GPUs,
  either class) leave room, bucketed by that room, sorted by free memory: where a fraction packs
  without over-committing the GPU (``placement`` tries these before an empty or a busy GPU).

Capacity only shrinks during a cycle (evictions take effect when the service carries them out),
which is what lets the caller memoise failed searches.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import attrgetter, is_
from typing import NamedTuple

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.filters import exclusivity, host_resources
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, ClusterSnapshot, JobClass, RunningJob



class Pool(NamedTuple):
    """GPUs that every static filter judges alike: one index pool."""

    model: str
    memory_mib: int
    gb_per_s: float  # the node's intra-node link
    has_runtime: bool  # the node runs jobs with an image
    mig_profile: str  # "" for a whole GPU


ROOM_STEP = 100
ROOM_BUCKETS = WHOLE_GPU_MILLI // ROOM_STEP + 1  # bucket 10 holds exactly one whole GPU of room
_by_index = attrgetter("index")


def room_bucket(room_milli: int) -> int:
    return min(ROOM_BUCKETS - 1, room_milli // ROOM_STEP)


class GpuSlot:
    __slots__ = ("key", "id", "index", "model", "node", "pool", "capacity_mib", "used_mib", "load_milli",
                 "live_load", "live_used_mib", "guaranteed_milli", "guaranteed_count", "exclusive", "occupants",
                 "blocked", "promised", "residents", "opp_entry", "guar_entry", "requested_milli", "req_entry",
                 "placed_guaranteed", "isolation", "unfenced_refusals", "margin_mib")

    def __init__(self, key: int, gpu, node: "NodeSlot", pool: int, live_load: float | None,
                 live_used_mib: int | None):
        self.key, self.id, self.index, self.model = key, gpu.id, gpu.index, gpu.model
        self.node, self.pool = node, pool
        self.capacity_mib = gpu.memory_mib
        self.isolation = gpu.isolation
        self.residents: list[RunningJob] = []
        self.reset(live_load, live_used_mib)

    def reset(self, live_load: float | None, live_used_mib: int | None) -> None:
        """As built, before any resident is added (what a renewed working copy starts a node from)."""
        self.used_mib = 0
        self.load_milli = 0
        self.live_load = live_load  # (the node agent's readings; None when not known)
        self.live_used_mib = live_used_mib
        self.guaranteed_milli = 0
        self.guaranteed_count = 0
        self.requested_milli = 0  # every resident's milli-GPUs, whatever its class
        self.exclusive = False  # holds a guaranteed job that shares with no other guaranteed job
        self.occupants = 0
        self.blocked = False  # unknown holder, or promised to a reclaiming job this cycle
        self.promised = False  # promised to a reclaiming job this cycle
        if self.residents:
            self.residents = []
        self.opp_entry: tuple[int, tuple[int, int]] | None = None  # (room bucket, (free, key))
        self.guar_entry: tuple[int, tuple[int, int]] | None = None
        self.req_entry: tuple[int, tuple[int, int]] | None = None
        self.placed_guaranteed = False  # a guaranteed job landed here this cycle
        self.unfenced_refusals = 0  # residents that refuse to share an unfenced GPU
        # Memory kept free for residents whose use may still grow (``needs_headroom``); a newcomer
        # must leave it, and memory pressure is judged against it.
        self.margin_mib = 0

    @property
    def joinable(self) -> bool:
        """Whether anything may join its residents at all (``filters.isolation``)."""
        return self.isolation != "mig" and not (self.isolation == "unfenced" and self.unfenced_refusals)

    @property
    def free_mib(self) -> int:
        return self.capacity_mib - self.used_mib


class NodeSlot:
    __slots__ = ("key", "name", "rack", "gb_per_s", "pool", "gpus", "empty", "schedulable", "cordoned", "reserved",
                 "has_runtime", "cpu_total", "host_total_mb", "cpu_free", "host_free_mb", "changes")

    def __init__(self, key: int, node, schedulable: bool):
        self.key, self.name, self.rack = key, node.name, node.rack
        self.gb_per_s = node.intra_node_gb_per_s
        self.pool: int | None = None
        self.gpus: list[GpuSlot] = []
        self.schedulable = schedulable
        self.cordoned = node.online and node.cordoned  # up, but an operator keeps new work off it
        self.has_runtime = bool(node.runtimes)  # can run jobs with an image
        # None: the node does not report it (never a constraint); free = total - residents' requests.
        self.cpu_total = node.cpu_milli
        self.host_total_mb = node.host_memory_mb
        self.reset()

    def reset(self) -> None:
        """As built, before any resident is added."""
        self.empty: list[GpuSlot] = []  # by GPU index
        self.reserved = False  # held for a blocked gang this cycle
        self.cpu_free = self.cpu_total
        self.host_free_mb = self.host_total_mb
        self.changes = 0  # placements and promises on it this cycle (what a score may cache by)

    @property
    def indexed(self) -> bool:
        return self.schedulable and not self.reserved


def needs_headroom(job: RunningJob, capacity_mib: int) -> bool:
    """False for a fraction held to its share of the GPU: that share is also its enforced limit
    (``placement.shape_of``), so nothing of it grows past what was planned."""
    share = capacity_mib * job.gpu_milli // WHOLE_GPU_MILLI  # (as ``Shape.memory_on`` rounds it)
    return not (job.gpu_milli < WHOLE_GPU_MILLI and job.memory_mib is not None and job.memory_mib <= share)


def resident_load_milli(job: RunningJob, utilisation: float | None) -> int:
    """Compute a resident uses: live (``utilisation``, its reading) if known, else :func:`load_milli`."""
    if utilisation is not None:
        return round(utilisation * WHOLE_GPU_MILLI)
    return load_milli(job.solo_utilisation, job.gpu_milli, job.duty_cycle)


def load_milli(solo_utilisation: float | None, gpu_milli: int, duty_cycle: float) -> int:
    """Compute a job uses with no live reading: its solo profile, else its request, times its duty
    cycle. The cycle that places a job counts it so, as every cycle after reads it back: counted
    otherwise, the room a placement leaves would open (or close) a cycle later."""
    solo = solo_utilisation if solo_utilisation is not None else gpu_milli / WHOLE_GPU_MILLI
    return round(solo * duty_cycle * WHOLE_GPU_MILLI)


# A renewal that would build more than this share of the nodes again builds them all anew instead.
RENEW_AT_MOST = 0.25


class _Source(NamedTuple):
    """What a working copy was built from: the inventory and the running jobs (the very objects a
    snapshot loader keeps while they do not change) and copies of the readings."""

    nodes: tuple
    running: tuple
    gpu_load: dict
    gpu_used: dict
    job_load: dict

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> "_Source":
        readings = snapshot.readings
        return cls(snapshot.nodes, snapshot.running, dict(readings.gpus), dict(readings.gpu_memory_used_mib),
                   dict(readings.jobs))

    def moved_since(self, before: "_Source",
                    by_id: dict[int, GpuSlot]) -> tuple[set[NodeSlot], list[RunningJob]] | None:
        """The nodes whose residents or readings differ from ``before``'s, and the running jobs
        ``before`` did not have (new, or changed: a job is a new object when it changes). None
        where the jobs both had are listed in another order, or one is listed twice: each GPU
        lists its residents in the snapshot's order, so every node would move."""
        moved: set[NodeSlot] = set()
        jobs_moved: list[RunningJob] = []
        arrived: list[RunningJob] = []
        if not _same_objects(self.running, before.running):
            then = {id(job) for job in before.running}
            now = {id(job) for job in self.running}
            if len(now) != len(self.running) or len(then) != len(before.running):
                return None
            if not _same_objects(tuple(job for job in before.running if id(job) in now),
                                 tuple(job for job in self.running if id(job) in then)):
                return None
            arrived = [job for job in self.running if id(job) not in then]
            jobs_moved = [job for job in before.running if id(job) not in now] + arrived
        for mine, theirs in ((self.gpu_load, before.gpu_load), (self.gpu_used, before.gpu_used)):
            if mine != theirs:
                for gpu_id, _ in mine.items() ^ theirs.items():
                    gpu = by_id.get(gpu_id)
                    if gpu is not None:
                        moved.add(gpu.node)
        if self.job_load != before.job_load:
            changed = {job_id for job_id, _ in self.job_load.items() ^ before.job_load.items()}
            jobs_moved += [job for job in self.running if job.id in changed]
        for job in jobs_moved:
            for gpu_id in job.gpu_ids:
                gpu = by_id.get(gpu_id)
                if gpu is not None:
                    moved.add(gpu.node)
        return moved, arrived


def _same_objects(these: tuple, those: tuple) -> bool:
    return these is those or (len(these) == len(those) and all(map(is_, these, those)))


class Capacity:
    def __init__(self, snapshot: ClusterSnapshot, config: SchedulerConfig):
        self.headroom = config.share_memory_headroom_mib
        self.max_load = config.max_shared_load_milli
        self.pools: list[Pool] = []
        self.nodes: list[NodeSlot] = []
        self.gpus: list[GpuSlot] = []
        self.by_id: dict[int, GpuSlot] = {}
        self.max_node_gpus = max((len(n.gpus) for n in snapshot.nodes), default=0)
        # (this loop and the next see every GPU of the cluster every cycle: lookups are hoisted)
        pools, pool_ids, gpus, by_id = self.pools, {}, self.gpus, self.by_id
        busy: list[GpuSlot] = []
        gpu_load, gpu_used = snapshot.readings.gpus.get, snapshot.readings.gpu_memory_used_mib.get
        for node in snapshot.nodes:
            slot = NodeSlot(len(self.nodes), node, node.schedulable)
            self.nodes.append(slot)
            link, runtime = node.intra_node_gb_per_s, bool(node.runtimes)
            node_gpus = slot.gpus
            for gpu in sorted(node.gpus, key=_by_index):
                pool_key = (gpu.model, gpu.memory_mib, link, runtime, gpu.mig_profile or "")
                pool = pool_ids.get(pool_key)
                if pool is None:
                    pool = pool_ids[pool_key] = len(pools)
                    pools.append(Pool(*pool_key))
                gpu_slot = GpuSlot(len(gpus), gpu, slot, pool, gpu_load(gpu.id), gpu_used(gpu.id))
                if gpu.busy:
                    busy.append(gpu_slot)
                gpus.append(gpu_slot)
                by_id[gpu.id] = gpu_slot
                node_gpus.append(gpu_slot)
            kinds = {g.pool for g in node_gpus}
            slot.pool = kinds.pop() if len(kinds) == 1 else None
        self._add_residents(snapshot.running, snapshot.readings.jobs, self.gpus)
        for gpu in busy:
            if not gpu.residents:  # the holder is unknown: nothing may join it
                gpu.blocked = True
        self.opp_index: list[list[list[tuple[int, int]]]] = [[[] for _ in range(ROOM_BUCKETS)] for _ in self.pools]
        self.guar_index: list[list[list[tuple[int, int]]]] = [[[] for _ in range(ROOM_BUCKETS)] for _ in self.pools]
        self.req_index: list[list[list[tuple[int, int]]]] = [[[] for _ in range(ROOM_BUCKETS)] for _ in self.pools]
        for node in self.nodes:
            node.empty = [g for g in node.gpus if g.occupants == 0 and not g.blocked]
        self._bucket_all()
        self._index_all()
        self._busy = {gpu.id for gpu in busy}  # (GPUs in use by no job it knows of: fixed with the inventory)
        self._source = _Source.of(snapshot)
        self._touched: set[NodeSlot] = set()  # nodes the cycle changed (``take``, ``block``, ``reserve``)

    def _bucket_all(self) -> None:
        """The empty-GPU buckets and the mixed nodes, every node in key order (placement scores the
        first few nodes of a bucket: a renewed copy must list them as a new one would)."""
        self.buckets: list[list[dict[int, None]]] = [
            [{} for _ in range(self.max_node_gpus + 1)] for _ in self.pools
        ]
        self.mixed_nodes: list[NodeSlot] = []
        for node in self.nodes:
            if node.schedulable:
                self._bucket_add(node)
        self.start_total_empty = [
            sum(k * len(bucket) for k, bucket in enumerate(self.buckets[pool])) for pool in range(len(self.pools))
        ]

    def renew(self, snapshot: ClusterSnapshot, config: SchedulerConfig) -> bool:
        """Make this working copy, which a cycle may have changed, exactly what
        ``Capacity(snapshot, config)`` would build, by building again only the nodes that cycle
        changed and those whose residents or readings moved since. False, and nothing done, where
        that would not pay or could not be done in place (the inventory or the config changed, many
        nodes moved, the running jobs came in another order, a GPU id or a job twice): build anew.

        A steady cycle at 1,024 nodes changes a handful; building all 8,192 GPUs again was a
        third of ``decide()``'s CPU there."""
        source = self._source
        if (config.share_memory_headroom_mib != self.headroom or config.max_shared_load_milli != self.max_load
                or len(self.by_id) != len(self.gpus) or not _same_objects(snapshot.nodes, source.nodes)):
            return False
        now = _Source.of(snapshot)
        found = now.moved_since(source, self.by_id)
        if found is None:
            return False
        moved, arrived = found
        dirty = self._touched | moved
        if len(dirty) > len(self.nodes) * RENEW_AT_MOST:
            return False
        if dirty:
            self._rebuild(dirty, arrived, snapshot)
        self._source, self._touched = now, set()
        return True

    def _rebuild(self, dirty: set[NodeSlot], arrived: list[RunningJob], snapshot: ClusterSnapshot) -> None:
        """Build the ``dirty`` nodes again in place from ``snapshot`` (``arrived``: its running
        jobs that the copy has not seen), and the buckets, which list every node in order."""
        gpu_load, gpu_used = snapshot.readings.gpus.get, snapshot.readings.gpu_memory_used_mib.get
        # The jobs on the dirty nodes now: those there before that still run, unchanged, and those
        # arrived (each made its nodes dirty), in the snapshot's order, as a new copy adds them.
        there = {id(job) for job in arrived}
        gpus: list[GpuSlot] = []
        for node in dirty:
            for gpu in node.gpus:
                there.update(map(id, gpu.residents))
                if gpu.opp_entry is not None or gpu.guar_entry is not None or gpu.req_entry is not None:
                    self._unindex(gpu)
                gpu.reset(gpu_load(gpu.id), gpu_used(gpu.id))
                gpus.append(gpu)
            node.reset()
        self._add_residents([job for job in snapshot.running if id(job) in there], snapshot.readings.jobs, gpus,
                            only=dirty)
        busy = self._busy
        for gpu in gpus:
            if gpu.id in busy and not gpu.residents:
                gpu.blocked = True
        for node in dirty:
            node.empty = [g for g in node.gpus if g.occupants == 0 and not g.blocked]
            for gpu in node.gpus:
                if gpu.occupants:
                    self._index(gpu)
        self._bucket_all()

    def _add_residents(self, running, job_readings, gpus: list[GpuSlot], only: set[NodeSlot] | None = None) -> None:
        """``running`` on ``gpus`` (all of them, or those on the nodes ``only``, which ``running``
        then holds every resident of)."""
        # (every running job of the cluster every cycle: ``resident_load_milli`` and
        # ``needs_headroom`` spelled out, what does not depend on the GPU read once a job)
        by_id, headroom, job_load, take = self.by_id, self.headroom, job_readings.get, host_resources.take
        for job in running:
            utilisation = job_load(job.id)
            load = round(utilisation * WHOLE_GPU_MILLI) if utilisation is not None else resident_load_milli(job, None)
            gpu_ids, memory, milli = job.gpu_ids, job.memory_mib, job.gpu_milli
            cpu = host_mb = 0
            if job.cpu_milli or job.host_memory_mb:
                cpu = host_resources.per_gpu(job.cpu_milli, len(gpu_ids)) if job.cpu_milli else 0
                host_mb = host_resources.per_gpu(job.host_memory_mb, len(gpu_ids)) if job.host_memory_mb else 0
            refuses_unfenced = not job.accepts_unfenced
            guaranteed = job.job_class is JobClass.GUARANTEED
            exclusive = exclusivity.holds_alone(job.job_class, job.shareable or milli < WHOLE_GPU_MILLI)
            held_to_share = milli < WHOLE_GPU_MILLI and memory is not None  # (see needs_headroom)
            for gpu_id in gpu_ids:
                gpu = by_id.get(gpu_id)
                if gpu is None or only is not None and gpu.node not in only:
                    continue
                if cpu or host_mb:
                    take(gpu.node, cpu, host_mb)
                gpu.residents.append(job)
                gpu.occupants += 1
                gpu.load_milli += load
                gpu.requested_milli += milli
                gpu.used_mib += gpu.capacity_mib if memory is None else memory  # as planned
                if refuses_unfenced:
                    gpu.unfenced_refusals += 1
                if gpu.margin_mib != headroom and (
                        not held_to_share or memory > gpu.capacity_mib * milli // WHOLE_GPU_MILLI):
                    gpu.margin_mib = headroom
                if guaranteed:
                    gpu.guaranteed_milli += milli
                    gpu.guaranteed_count += 1
                    if exclusive:
                        gpu.exclusive = True
        for gpu in gpus:
            if not gpu.residents:
                continue  # a live reading on an empty GPU is usually a job that just ended
            if gpu.live_used_mib is not None and gpu.live_used_mib > gpu.used_mib:
                gpu.used_mib = gpu.live_used_mib
            if gpu.live_load is not None:
                gpu.load_milli = round(gpu.live_load * WHOLE_GPU_MILLI)

    # -- index maintenance -------------------------------------------------------------------

    def _bucket_add(self, node: NodeSlot) -> None:
        if not node.indexed:
            return
        if node.pool is None:
            if node not in self.mixed_nodes:
                self.mixed_nodes.append(node)
        elif node.empty:
            self.buckets[node.pool][len(node.empty)][node.key] = None

    def _bucket_remove(self, node: NodeSlot) -> None:
        if node.pool is not None and node.empty:
            self.buckets[node.pool][len(node.empty)].pop(node.key, None)

    def _place(self, gpu: GpuSlot) -> bool:
        """Set where ``gpu`` belongs in each index (``opp_entry``, ``guar_entry``, ``req_entry``; left None where
        in neither, as an unindexed GPU has them); False if it belongs in none."""
        # (``NodeSlot.indexed``, ``GpuSlot.joinable``, ``GpuSlot.free_mib`` and ``room_bucket``
        # spelled out: this sees every occupied GPU of the cluster every cycle, and every GPU a
        # placement takes)
        node, isolation = gpu.node, gpu.isolation
        if (gpu.blocked or gpu.occupants == 0 or not node.schedulable or node.reserved or isolation == "mig"
                or (isolation == "unfenced" and gpu.unfenced_refusals)):
            return False
        free = gpu.capacity_mib - gpu.used_mib
        if free <= self.headroom:
            return False
        entry = (free, gpu.key)
        load, max_load = gpu.load_milli, self.max_load
        if load < max_load:
            bucket = (max_load - load) // ROOM_STEP
            gpu.opp_entry = (bucket if bucket < ROOM_BUCKETS else ROOM_BUCKETS - 1, entry)
        if not gpu.exclusive and gpu.guaranteed_milli < WHOLE_GPU_MILLI:
            bucket = (WHOLE_GPU_MILLI - gpu.guaranteed_milli) // ROOM_STEP
            gpu.guar_entry = (bucket if bucket < ROOM_BUCKETS else ROOM_BUCKETS - 1, entry)
        if gpu.requested_milli < WHOLE_GPU_MILLI:
            gpu.req_entry = ((WHOLE_GPU_MILLI - gpu.requested_milli) // ROOM_STEP, entry)
        return True

    def _index(self, gpu: GpuSlot) -> None:
        if self._place(gpu):
            for index, placed in ((self.opp_index, gpu.opp_entry), (self.guar_index, gpu.guar_entry),
                                  (self.req_index, gpu.req_entry)):
                if placed is not None:
                    insort(index[gpu.pool][placed[0]], placed[1])

    def _index_all(self) -> None:
        """``_index`` every occupied GPU, as the build's last step: each bucket sorted once at the
        end, not kept sorted one insertion at a time (this sees every GPU of a full cluster every
        cycle)."""
        place, opp_index, guar_index, req_index = self._place, self.opp_index, self.guar_index, self.req_index
        for gpu in self.gpus:
            if gpu.occupants and place(gpu):
                if (placed := gpu.opp_entry) is not None:
                    opp_index[gpu.pool][placed[0]].append(placed[1])
                if (placed := gpu.guar_entry) is not None:
                    guar_index[gpu.pool][placed[0]].append(placed[1])
                if (placed := gpu.req_entry) is not None:
                    req_index[gpu.pool][placed[0]].append(placed[1])
        for buckets in (*opp_index, *guar_index, *req_index):
            for bucket in buckets:
                bucket.sort()

    def _unindex(self, gpu: GpuSlot) -> None:
        for index, entry in ((self.opp_index[gpu.pool], gpu.opp_entry), (self.guar_index[gpu.pool], gpu.guar_entry),
                             (self.req_index[gpu.pool], gpu.req_entry)):
            if entry is not None:
                bucket = index[entry[0]]
                at = bisect_left(bucket, entry[1])
                if at < len(bucket) and bucket[at] == entry[1]:  # (else an index update cut short)
                    del bucket[at]
        gpu.opp_entry = gpu.guar_entry = gpu.req_entry = None

    # -- queries -----------------------------------------------------------------------------

    def max_empty(self, pool: int) -> int:
        buckets = self.buckets[pool]
        for k in range(len(buckets) - 1, 0, -1):
            if buckets[k]:
                return k
        return 0

    def most_free_on_a_node(self, pools: list[int]) -> int:
        """Most empty GPUs of one model (a gang never mixes models) among ``pools`` on any node."""
        best = max((self.max_empty(p) for p in pools), default=0)
        for node in self.mixed_nodes:
            per_model: dict[str, int] = {}
            for g in node.empty:
                if g.pool in pools:
                    model = self.pools[g.pool].model
                    per_model[model] = per_model.get(model, 0) + 1
            best = max(best, max(per_model.values(), default=0))
        return best

    # -- mutation ----------------------------------------------------------------------------

    def take(self, gpus: list[GpuSlot], job_class: JobClass, memory_mib: list[int], demand_milli: int,
             gpu_milli: int, shareable: bool, cpu_per_gpu: int = 0, host_mb_per_gpu: int = 0,
             accepts_unfenced: bool = True, headroom_mib: int = 0) -> None:
        """Commit a placement: each GPU in ``gpus`` gets the job's memory and compute, its node
        the job's CPU and host memory for that GPU."""
        nodes = {g.node.key: g.node for g in gpus}
        self._touched.update(nodes.values())
        for node in nodes.values():
            self._bucket_remove(node)
            node.changes += 1
        guaranteed = job_class is JobClass.GUARANTEED
        alone = exclusivity.holds_alone(job_class, shareable)
        for gpu, memory in zip(gpus, memory_mib):
            if cpu_per_gpu or host_mb_per_gpu:
                host_resources.take(gpu.node, cpu_per_gpu, host_mb_per_gpu)
            if gpu.opp_entry is not None or gpu.guar_entry is not None or gpu.req_entry is not None:
                self._unindex(gpu)  # (an empty GPU is in no index)
            if gpu.occupants == 0:
                gpu.node.empty.remove(gpu)
            gpu.occupants += 1
            gpu.requested_milli += gpu_milli
            gpu.used_mib += memory
            gpu.load_milli += demand_milli
            if not accepts_unfenced:
                gpu.unfenced_refusals += 1
            if headroom_mib > gpu.margin_mib:
                gpu.margin_mib = headroom_mib
            if guaranteed:
                gpu.guaranteed_milli += gpu_milli
                gpu.guaranteed_count += 1
                gpu.placed_guaranteed = True
                if alone:
                    gpu.exclusive = True
            self._index(gpu)
        for node in nodes.values():
            self._bucket_add(node)

    def block(self, gpu: GpuSlot) -> None:
        """Promise a GPU to a reclaiming job: nothing else may land on it this cycle."""
        if gpu.promised:
            return
        self._touched.add(gpu.node)
        self._bucket_remove(gpu.node)
        self._unindex(gpu)
        if gpu in gpu.node.empty:
            gpu.node.empty.remove(gpu)
        gpu.blocked = gpu.promised = True
        gpu.node.changes += 1
        self._bucket_add(gpu.node)

    def dismantle(self) -> None:
        """Break the references between nodes and their GPUs once the cycle is done with them, so
        that reference counting frees this working copy at once. Left in cycles, its ~10^4 slots
        (and the running jobs their residents lists hold) wait for the garbage collector, whose
        next pass then walks every object the cycle allocated: ~35 ms a cycle at 8,192 GPUs."""
        for node in self.nodes:
            node.gpus = node.empty = []

    def reserve(self, node: NodeSlot) -> None:
        """Hold a node for a blocked gang: out of every index; only backfill may look at it."""
        if node.reserved:
            return
        self._touched.add(node)
        self._bucket_remove(node)
        for gpu in node.gpus:
            self._unindex(gpu)
        node.reserved = True
        if node in self.mixed_nodes:
            self.mixed_nodes.remove(node)
