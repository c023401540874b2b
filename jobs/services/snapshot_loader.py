"""Build the scheduler core's ClusterSnapshot from the database and Redis.

The database says what exists and who holds what; Redis adds liveness (heartbeats) and live
usage (each node's latest sample). Queries are a fixed handful per cycle, never per job.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import fields
from itertools import groupby
from operator import attrgetter, is_, itemgetter

from django.db import connection, transaction
from django.db.models import (Case, ExpressionWrapper, F, FloatField, Func, OuterRef, Q, Subquery, Sum, TextField,
                              Value, When)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce

from jobs.choices import RunClass
from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Allocation, Job, JobArray, JobDependency, JobProfile, JobPromise, Membership, Tenant
from jobs.scheduling import ClusterSnapshot, GpuState, JobRequest, LiveReadings, NodeState, TenantQuota, UserLimit
from jobs.scheduling.frozen_builder import builder
from jobs.scheduling.snapshot import WHOLE_GPU_MILLI, JobClass, Promise, RecordedProfile, RunningJob
from jobs.services.bulk_rows import ids_in
from jobs.services.job_feed import JobFeed
from jobs.services.row_versions import RowVersions, listing, steady_scan_order
from jobs.services.table_changes import KeptWhileUnchanged, mark_sql, marks, written_here
from monitoring.choices import NodeHealth
from monitoring.models import Gpu, JobUsage, Node
from monitoring.services import live
from monitoring.services.health import live_node_names

# Slowest GPU-to-GPU link inside a node, GB/s, when the agent reported no usable topology.
PCIE_GB_PER_S = 32.0
# Agents report NVLink bandwidth in Gbit/s.
BITS_PER_BYTE = 8


def build_snapshot(redis_client) -> ClusterSnapshot:
    return _build(redis_client, None)


def checked_snapshot(redis_client) -> tuple[ClusterSnapshot, list[str]]:
    """The snapshot as a process that kept nothing builds it, and the parts (``nodes``,
    ``running``, ...) in which the one built from what was kept differs: empty unless a cache
    here has a bug. Both are built from the same database state (one repeatable-read transaction
    where none is open yet) and the same heartbeats and samples. The loop asks now and then, so
    that a wrong cache is said and dropped within minutes instead of steering it for as long as
    the process lives."""
    outermost = not connection.in_atomic_block  # (a transaction already under way keeps its level)
    with transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        heard = _heard(redis_client, _node_rows())
        kept = _build(redis_client, heard)
        forget()
        fresh = _build(redis_client, heard)
    return fresh, [part.name for part in fields(ClusterSnapshot)
                   if getattr(kept, part.name) != getattr(fresh, part.name)]


def _heard(redis_client, nodes: list[tuple]) -> tuple[set[str], dict[str, live.NodeUse]]:
    """Of these node rows: the nodes whose heartbeat is alive, and their last samples."""
    names = [name for _, name, *_ in nodes]
    return live_node_names(redis_client, names), live.latest_use(redis_client, names)


def _build(redis_client, heard: tuple[set[str], dict] | None) -> ClusterSnapshot:
    """``heard``: what :func:`_heard` said, when already asked."""
    nodes, gpus = _inventory_rows.get(_inventory)
    online, samples = heard if heard is not None else _heard(redis_client, nodes)
    node_states = _nodes(nodes, gpus, online)
    gpu_nodes, gpu_memory, gpu_ids, gpu_index = _gpu_facts(node_states)
    tenants = list(Tenant.objects.values_list("id", "slug", "guaranteed_gpus", "max_gpus", "weight", "decayed_usage",
                                              "unfenced_sharing"))
    slugs = {tenant_id: slug for tenant_id, slug, *_ in tenants}
    unfenced = {tenant_id: consent for tenant_id, *_, consent in tenants}
    running, held_on = _running(gpu_nodes, gpu_memory, slugs, unfenced, gpu_index)
    return ClusterSnapshot(
        nodes=node_states,
        pending=_pending(max(gpu_memory.values(), default=None), slugs, unfenced),
        tenants=tuple(
            TenantQuota(name=slug, guaranteed_gpus=guaranteed, max_gpus=ceiling, weight=weight,
                        decayed_usage=decayed_usage)
            for _, slug, guaranteed, ceiling, weight, decayed_usage, _ in tenants
        ),
        running=running,
        user_limits=_user_limits(slugs),
        promises=_promises(slugs),
        readings=_readings(samples, gpu_ids, held_on),
    )


# The most GPUs one promise may name: more than any job may ask for (``Job.gpus`` is validated far
# below this); a longer list is not the loop's and is ignored.
MAX_PROMISED_GPUS = 4096


# Everything kept from one snapshot to the next (see each): dropped by :func:`forget`.
KEPT = ("_node_states", "_all_nodes", "_inventory_rows", "_facts", "_running_jobs", "_running_for", "_built",
        "_built_for", "_derived",
        "_whole", "_pending_versions", "_served_before", "_pending_read", "_allocation_rows", "_allocation_versions",
        "_allocations_in_order", "_running_last", "_pending_feed", "_step")


def forget() -> None:
    """Drop what was kept from earlier snapshots: the next one is built as a new process builds it."""
    global _node_states, _all_nodes, _inventory_rows, _facts, _running_jobs, _running_for, _built, _built_for
    global _derived, _whole
    global _pending_versions, _served_before, _pending_read, _allocation_rows, _running_last
    global _allocation_versions, _allocations_in_order, _pending_feed, _step
    _node_states, _all_nodes, _facts, _running_jobs, _running_for = {}, (None, ()), ((), ({}, {}, {}, {})), {}, ()
    _inventory_rows = KeptWhileUnchanged(Node, Gpu)
    _allocation_rows = KeptWhileUnchanged(Allocation, Job)
    _allocation_versions, _allocations_in_order = RowVersions(), (None, {}, [])
    _built, _built_for, _derived, _whole = {}, (), (None, set(), set()), (None, ())
    _step = (None, None, frozenset())
    _pending_versions = RowVersions(ordered=True)
    _pending_feed = JobFeed()
    _served_before = {}
    _running_last = None
    _pending_read = (None, {})


def _promises(slugs: dict[int, str]) -> tuple[Promise, ...]:
    """The GPUs earlier reclaims freed for jobs still pending (a handful of rows)."""
    rows = list(JobPromise.objects.order_by("job_id").values_list("job_id", "gpu_ids"))
    if not rows:
        return ()  # (most cycles: no join with the jobs table, whose plan would depend on its statistics)
    tenants = dict(Job.objects.filter(pk__in=[job_id for job_id, _ in rows], state=JobState.PENDING)
                   .values_list("pk", "tenant_id"))
    promises = []
    for job_id, gpu_ids in rows:
        tenant_id = tenants.get(job_id)
        if (tenant_id in slugs and isinstance(gpu_ids, list) and 0 < len(gpu_ids) <= MAX_PROMISED_GPUS
                and all(type(gpu_id) is int for gpu_id in gpu_ids)):
            promises.append(Promise(job_id, slugs[tenant_id], tuple(gpu_ids)))
    return tuple(promises)


def _user_limits(slugs: dict[int, str]) -> tuple[UserLimit, ...]:
    """What tenant leads allow their members (users are keyed by id, as on the jobs)."""
    return tuple(
        UserLimit(tenant=slugs[tenant_id], user=str(user_id), name=username, max_gpus=max_gpus,
                  max_running=max_running)
        for tenant_id, user_id, username, max_gpus, max_running in Membership.objects.filter(
            Q(max_gpus__isnull=False) | Q(max_running_jobs__isnull=False)).values_list(
            "tenant_id", "user_id", "user__username", "max_gpus", "max_running_jobs")
        if tenant_id in slugs)


def _epoch(expression):
    """A time as seconds since the epoch, computed by PostgreSQL: parsing 50,000 datetimes in Python
    was a third of the snapshot. The same float as ``datetime.timestamp()`` (each rounds the exact
    microsecond count once). Elsewhere the datetime itself, for :func:`_seconds`."""
    expression = F(expression) if isinstance(expression, str) else expression
    if connection.vendor == "postgresql":
        return Func(expression, template="EXTRACT(EPOCH FROM %(expressions)s)::float8", output_field=FloatField())
    return expression


def _seconds(value) -> float | None:
    return value if value is None or isinstance(value, float) else value.timestamp()


def _rows(queryset) -> list[tuple]:
    """A ``values_list`` queryset's rows. On PostgreSQL fetched in one go without Django's per-row
    converters (psycopg's loaders in C do the work): the queryset must then select no column that
    needs a converter (datetimes and JSON come as epochs and text, see :func:`_epoch`)."""
    if connection.vendor != "postgresql":
        return list(queryset)
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def intra_node_bandwidth(topology: list[dict]) -> float:
    if topology and all(link["kind"] == "nvlink" and link.get("bandwidth_gbps") for link in topology):
        return min(link["bandwidth_gbps"] for link in topology) / BITS_PER_BYTE
    return PCIE_GB_PER_S


# Rows, not model instances, throughout: building ORM objects for every GPU, allocation and
# pending job was most of the snapshot's cost at 1,024 nodes and 50,000 pending jobs.
NODE_FIELDS = ("id", "name", "cordoned", "rack", "topology_text", "runtimes_text", "cpu_milli", "host_memory_mib",
               "state")


# The nodes of the last snapshot by id: what each was built from (its row, its GPUs' rows, whether
# it was up) and the NodeState. Live readings are not part of it (``LiveReadings``), so a node
# whose rows did not change is the very same object from one cycle to the next: building 8,000
# GPUs again every cycle was a sixth of the loop's snapshot. Replaced by this snapshot's nodes
# every time, so nodes removed are forgotten.
_node_states: dict[int, tuple[tuple, NodeState]] = {}
# (every row and who is up, the nodes): most cycles nothing of it changed at all.
_all_nodes: tuple = (None, ())
# The rows ``_inventory`` reads, kept while neither table's change mark moved: a node registers or
# changes health a few times a day, and a cycle read 1,024 + 8,192 rows every 2 s to find them the same.
_inventory_rows = KeptWhileUnchanged(Node, Gpu)


def _nodes(nodes: list[tuple], gpus: list[tuple], online: set[str]) -> tuple[NodeState, ...]:
    global _node_states, _all_nodes
    if _all_nodes[0] == (nodes, gpus, online):
        return _all_nodes[1]
    gpus_by_node: dict[int, list[tuple]] = defaultdict(list)
    for node_id, *gpu in gpus:
        gpus_by_node[node_id].append(tuple(gpu))
    states, kept, before = [], {}, _node_states
    for row in nodes:
        node_id, name = row[0], row[1]
        built_from = (row, gpus_by_node[node_id], name in online)
        cached = before.get(node_id)
        state = cached[1] if cached is not None and cached[0] == built_from else _node(*built_from)
        kept[node_id] = (built_from, state)
        states.append(state)
    _node_states, _all_nodes = kept, ((nodes, gpus, online), tuple(states))
    return _all_nodes[1]


def _inventory() -> tuple[list[tuple], list[tuple]]:
    """The nodes' rows and their present GPUs' rows."""
    return _node_rows(), _rows(Gpu.objects.filter(present=True).order_by("node_id", "index").values_list(
        "node_id", "id", "index", "model", "memory_mib", "isolation", "mig_profile"))


def _node_rows() -> list[tuple]:
    return _rows(Node.objects.order_by("name").annotate(topology_text=Cast("topology", TextField()),
                                                      runtimes_text=Cast("runtimes", TextField()))
                 .values_list(*NODE_FIELDS))


def _node(row: tuple, gpus: list[tuple], online: bool) -> NodeState:
    _, name, cordoned, rack, topology, runtimes, cpu_milli, host_memory_mib, state = row  # (JSON as text)
    # A LOST node heartbeating again is not online until node health brings it back UP: until then
    # a process of a job requeued from it may still hold its GPUs (health.revive_heartbeating).
    online = online and state == NodeHealth.UP
    return NodeState(
        name=name,
        gpus=tuple(GpuState(id=gpu_id, index=index, model=model, memory_mib=memory_mib, isolation=isolation,
                            mig_profile=mig_profile)
                   for gpu_id, index, model, memory_mib, isolation, mig_profile in gpus),
        online=online,
        cordoned=cordoned,
        rack=rack,
        intra_node_gb_per_s=intra_node_bandwidth(json.loads(topology) if topology else []),
        runtimes=frozenset(json.loads(runtimes) or () if runtimes else ()),
        cpu_milli=cpu_milli,
        host_memory_mb=host_memory_mib,
    )


# (the nodes they were derived from, (GPU id -> node name, GPU id -> memory, node name -> GPU
# index -> id)): the same while the nodes are the same objects, as they are most cycles
_facts: tuple = ((), ({}, {}, {}, {}))


def _gpu_facts(node_states: tuple[NodeState, ...]) -> tuple[dict[int, str], dict[int, int], dict[str, dict],
                                                              dict[int, int]]:
    """By GPU id: its node's name, its memory; by node, GPU index -> id; by GPU id, its index."""
    global _facts
    if len(_facts[0]) != len(node_states) or not all(map(is_, _facts[0], node_states)):
        _facts = (node_states, ({gpu.id: node.name for node in node_states for gpu in node.gpus},
                                {gpu.id: gpu.memory_mib for node in node_states for gpu in node.gpus},
                                {node.name: {gpu.index: gpu.id for gpu in node.gpus} for node in node_states},
                                {gpu.id: gpu.index for node in node_states for gpu in node.gpus}))
    return _facts[1]


def _readings(samples: dict[str, live.NodeUse], gpu_ids: dict[str, dict[int, int]],
              held_on: dict[int, tuple[str | None, ...]]) -> LiveReadings:
    """What the nodes' last samples say of their GPUs (``gpu_ids``: per node, GPU index -> id)
    and of the jobs they run (``held_on``: the nodes each running job holds GPUs on)."""
    load: dict[int, float] = {}
    used: dict[int, int] = {}
    for node, sample in samples.items():
        ids = gpu_ids.get(node)
        if ids is None:
            continue
        for reading in sample.gpus:  # (an index sent twice: its last reading counts)
            gpu_id = ids.get(reading.index)
            if gpu_id is not None:
                if reading.util_sm is not None:
                    load[gpu_id] = reading.util_sm / 100.0
                else:
                    load.pop(gpu_id, None)
                if reading.mem_used_mib is not None:
                    used[gpu_id] = reading.mem_used_mib
                else:
                    used.pop(gpu_id, None)
    return LiveReadings(gpus=load, gpu_memory_used_mib=used, jobs=_live_job_utilisation(samples, held_on))


def _profile_inputs(profiles: dict[tuple[int, str], JobProfile]) -> dict[tuple[int, str], tuple]:
    """What a request or running job takes of each profile, comparable from one snapshot to the
    next: a mean that is not a number (NaN, written by something else) compares equal to itself
    here, or every snapshot would build every job of that profile again."""
    return {key: (p.peak_gpu_memory_mib, _comparable(p.mean_util), _comparable(p.mean_runtime_s))
            for key, p in profiles.items()}


def _comparable(value: float | None):
    return "NaN" if value != value else value


def _profiles(tenant_keys: set[tuple[int, str]]) -> dict[tuple[int, str], JobProfile]:
    if not tenant_keys:
        return {}
    keys = {key for _, key in tenant_keys}
    return {
        (p.tenant_id, p.key): p
        for p in JobProfile.objects.filter(key__in=keys)
        if (p.tenant_id, p.key) in tenant_keys
    }


PENDING_FIELDS = ("id", "tenant_id", "gpus", "submitted_s", "gpu_memory_mib", "priority", "gpu_milli",
                  "gpu_models_text", "opportunistic_only", "shareable", "max_nodes", "max_runtime_s", "profile_key",
                  "reserved_since_s", "image", "array_id", "cpu_milli", "host_memory_mib",
                  "owner_id", "mig_profile", "accepts_unfenced")
# Read after PENDING_FIELDS: the GPU-seconds of the job's earlier runs, computed by the database
# (:func:`_attained`), so that a cached row tells whether its request must be built again; then the
# row's version (PostgreSQL; None elsewhere), which the request does not read (a row rewritten with
# nothing changed reads as another row: its request is built again).
LAST_FIELDS = ("attained_gpu_s", "row_version")


# The pending requests of the last snapshot, per job: what each was built from and the request.
# A job whose row, unfinished dependencies and profile did not change keeps its (immutable)
# request: constructing 50,000 frozen dataclasses was most of the snapshot's Python time. Replaced
# by this snapshot's jobs every time, so it never outgrows the queue; dropped when the tenants'
# names, their unfenced-sharing consent or the largest GPU change (what every request is also built from).
_built: dict[int, tuple[tuple, tuple, JobRequest]] = {}
_built_for: tuple = ()
# What a job without dependencies, profile or array is built from besides its row.
NO_INPUTS = ((), None, None)


# The same rows as last time (by their row versions' generation): what was derived from all of
# them, and the requests built, with everything else they were built from.
# (generation, (tenant, profile key)s, array ids[, their counts, the rows counted]): ``_derived_now``
_derived: tuple = (None, set(), set())
_whole: tuple = (None, ())  # (every input, the requests)
# The last requests made from the ones before them by building only some rows' requests again:
# (the requests before, after, the ids of those rows). ``pending_step``.
_step: tuple = (None, None, frozenset())


def pending_step(before: tuple[JobRequest, ...], now: tuple[JobRequest, ...]) -> frozenset[int] | None:
    """The ids of the jobs whose request changed, came or went between the pending requests
    ``before`` and ``now`` (both this loader's, by job id), where ``now`` was made from ``before``
    by building only those again; else None (compare them whole)."""
    return _step[2] if _step[0] is before and _step[1] is now else None


def last_pending_step() -> tuple[tuple[JobRequest, ...] | None, tuple[JobRequest, ...] | None, frozenset[int]]:
    """How the last pending requests were made, as ``Carry.pending_step`` takes it: (the requests
    before, after, the ids of the rows built again); (None, None, ...) where they were built whole."""
    return _step


def _pending(largest_gpu_mib: int | None, slugs: dict[int, str], unfenced: dict[int, bool]) -> tuple[JobRequest, ...]:
    """The pending requests, by job id."""
    global _built, _built_for, _derived, _whole, _step
    rows = _pending_rows()
    generation = _pending_versions.generation if connection.vendor == "postgresql" else None
    if generation is None or _derived[0] != generation:
        _derived = _derived_now(rows, generation)
    _, profile_keys, array_ids = _derived[:3]
    profiles = _profiles(profile_keys)
    core_profiles = {
        key: (RecordedProfile(peak_memory_mib=_bounded(profile.peak_gpu_memory_mib, largest_gpu_mib),
                          mean_utilisation=profile.mean_util if profile.mean_util is not None else 1.0), profile)
        for key, profile in profiles.items()
    }
    profile_inputs = _profile_inputs(profiles)
    waiting_for = _unfinished_dependencies()
    array_limits = dict(JobArray.objects.filter(id__in=array_ids).values_list("id", "max_running"))
    context = (largest_gpu_mib, sorted(slugs.items()), sorted(unfenced.items()))
    inputs_now = (generation, context, profile_inputs, waiting_for, array_limits)
    if generation is not None and _whole[0] == inputs_now:
        return _whole[1]  # the same rows, built from the same facts: the same requests
    build = _Builder(slugs, unfenced, core_profiles, profile_inputs, waiting_for, array_limits)
    delta = _pending_versions.delta if generation is not None else None
    if (delta is not None and _whole[0] is not None and delta[0] == _whole[0][0] and _built_for == context
            and _whole[0][1:] == inputs_now[1:]):
        # Only some rows were read again since the last requests (a job submitted, placed or
        # edited), everything else they are built from is the same: those rows' requests change,
        # the rest stay where they are (a pass over 50,000 jobs was a tenth of a busy cycle).
        # (each found by bisection in the requests, which are by id: no pass over all of them)
        requests = list(_whole[1])
        for job_id in sorted(delta[1]):
            at = bisect_left(requests, job_id, key=_request_id)
            if at < len(requests) and requests[at].id == job_id:
                del requests[at]
            cached = _built.pop(job_id, None)
            row = rows.get(job_id)
            if row is not None:
                _built[job_id] = entry = build(row, cached)
                requests.insert(at, entry[2])
        _step = (_whole[1], tuple(requests), frozenset(delta[1]))
        _whole = (inputs_now, _step[1])
        return _whole[1]
    _step = (None, None, frozenset())
    previous = _built if _built_for == context else {}
    if previous:
        built: dict[int, tuple[tuple, tuple, JobRequest]] = {}
        requests = []
        for job_id, row in rows.items():
            built[job_id] = entry = build(row, previous.get(job_id))
            requests.append(entry[2])
    else:  # (nothing to keep, as in a new process: no look for a cached request per row)
        entries = list(map(build.fresh, rows.values()))
        built, requests = dict(zip(rows, entries)), list(map(_third_item, entries))
    _built, _built_for = built, context
    _whole = (inputs_now, tuple(requests))
    return _whole[1]


def _derived_now(rows: dict[int, tuple], generation: int | None) -> tuple:
    """(generation, the (tenant, profile key)s and the array ids the pending rows name, counts of
    each, the rows they were counted from): counted again only for the rows read again since the
    last count (``RowVersions.delta``), not for every pending job."""
    delta = _pending_versions.delta if generation is not None else None
    if delta is not None and _derived[0] is not None and delta[0] == _derived[0]:
        profiles, arrays, before = _derived[3], _derived[4], _derived[5]
        for job_id in delta[1]:
            for found, step in ((before.get(job_id), -1), (rows.get(job_id), 1)):
                if found is not None:
                    if found[12]:
                        profiles[(found[1], found[12])] += step
                    if found[15] is not None:
                        arrays[found[15]] += step
        profiles, arrays = +profiles, +arrays  # (those no row names any more dropped)
    else:
        profiles = Counter((row[1], row[12]) for row in rows.values() if row[12])
        arrays = Counter(row[15] for row in rows.values() if row[15] is not None)
    return generation, set(profiles), set(arrays), profiles, arrays, rows


_request_id = attrgetter("id")
_first_item, _third_item, _last_item = itemgetter(0), itemgetter(2), itemgetter(-1)


class _Builder:
    """A pending job's request from its row and the facts of this snapshot, or the one built last
    time when nothing it is built from changed (``cached``: (row, inputs, request))."""

    def __init__(self, slugs, unfenced, core_profiles, profile_inputs, waiting_for, array_limits):
        self.slugs, self.unfenced, self.core_profiles = slugs, unfenced, core_profiles
        self.profile_inputs, self.waiting_for, self.array_limits = profile_inputs, waiting_for, array_limits
        # Allowed models, stored as JSON text, decoded once per distinct value (most are "[]").
        self.models: dict[str | None, frozenset] = {None: frozenset()}

    def __call__(self, row: tuple, cached: tuple | None) -> tuple[tuple, tuple, JobRequest]:
        inputs = self._inputs(row)
        # (a row kept by its version is the very tuple built from last time)
        if cached is not None and (cached[0] is row or cached[0] == row) and (
                cached[1] is inputs or cached[1] == inputs):
            return cached
        return self._made(row, inputs)

    def fresh(self, row: tuple) -> tuple[tuple, tuple, JobRequest]:
        """As a call with nothing cached (a new process's 47,000 rows)."""
        return self._made(row, self._inputs(row))

    def _made(self, row: tuple, inputs: tuple) -> tuple[tuple, tuple, JobRequest]:
        return row, inputs, _request(row, self.slugs, self.unfenced, self.core_profiles, self.models, inputs[0],
                                     inputs[2])

    def _inputs(self, row: tuple) -> tuple:
        job_id, profile_key, array_id = row[0], row[12], row[15]
        if profile_key or array_id is not None or job_id in self.waiting_for:
            return (self.waiting_for.get(job_id, ()),
                    self.profile_inputs.get((row[1], profile_key)) if profile_key else None,
                    self.array_limits.get(array_id) if array_id is not None else None)
        return NO_INPUTS  # most jobs: one shared tuple, compared by identity


def _pending_queryset():
    """Every pending job's PENDING_FIELDS and LAST_FIELDS."""
    version = (RawSQL(f"{connection.ops.quote_name(Job._meta.db_table)}.xmin::text", ())
               if connection.vendor == "postgresql" else Value(None, output_field=TextField()))
    return (Job.objects.filter(state=JobState.PENDING).order_by()
            .annotate(submitted_s=_epoch("submitted_at"), reserved_since_s=_epoch("reserved_since"),
                      gpu_models_text=Cast("gpu_models", TextField()), attained_gpu_s=_attained(),
                      row_version=version))


def _attained():
    """A job's GPU-seconds in its released allocations (:func:`_earlier_service`), 0.0 for a job
    never placed, as a column of its row: computed beside the row, where building each of 47,000
    rows again in Python with it cost a new process's first cycle 40 ms."""
    served = (Allocation.objects.filter(job_id=OuterRef("id"), released_at__isnull=False).order_by()
              .values("job_id").annotate(served=Sum(_held_milli_s())).values("served"))
    return Case(When(attempt__gt=0, then=Coalesce(Subquery(served, output_field=FloatField()) / Value(
        float(WHOLE_GPU_MILLI)), Value(0.0))), default=Value(0.0), output_field=FloatField())


# PostgreSQL: the pending rows of the last snapshot, by row version: only jobs submitted, requeued
# or edited since are read in full (50,000 rows of 21 columns were a third of a steady snapshot).
_pending_versions = RowVersions(ordered=True)
# PostgreSQL: where the jobs written since the last read of the pending rows are found.
_pending_feed = JobFeed()
# Elsewhere (SQLite): the jobs table's change mark and the pending rows read after it.
_pending_read: tuple[str | None, dict[int, tuple]] = (None, {})


def _pending_rows() -> dict[int, tuple]:
    """Job id -> row of every pending job, by id. While the jobs table's change mark stays where
    it was at the last read (nothing written to it since), that read's rows, without a scan."""
    global _pending_read, _pending_versions
    mark = marks([Job])[0]
    if connection.vendor != "postgresql":
        if mark is not None and mark == _pending_read[0]:
            return _pending_read[1]
        # (the mark read before the rows: a write between the two moves the mark the next cycle reads)
        rows = list(_pending_queryset().order_by("id").values_list(*PENDING_FIELDS, *LAST_FIELDS))
        _pending_read = (mark, {row[0]: row for row in rows})
        return _pending_read[1]
    kept = _pending_versions.unchanged(mark)
    if kept is not None:
        return kept
    table = connection.ops.quote_name(Job._meta.db_table)

    def fetch(ids: list[str] | None):
        if ids is not None:
            read = _rows(_pending_queryset().filter(id__in=ids_in(ids)).values_list(*PENDING_FIELDS, *LAST_FIELDS))
        else:
            # (the service subquery, run only for the few jobs placed before, still makes the
            # planner's estimate of the whole queue's read pass jit_above_cost: compiling it cost
            # PostgreSQL 50 ms of the read's 90)
            with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('jit', 'off', true)")
                read = _rows(_pending_queryset().values_list(*PENDING_FIELDS, *LAST_FIELDS))
        return zip(map(_first_item, read), map(_last_item, read), read)

    if mark is None and written_here(Job):
        # (this transaction wrote jobs, maybe inside a savepoint: every row read, none kept)
        _pending_versions = RowVersions(ordered=True)
        return dict(sorted(((row_id, value) for row_id, _, value in fetch(None)), key=_first_item))
    if _pending_versions.never_read:
        token = _pending_feed.before_full_read()
        rows = _pending_versions.read_every(fetch)  # (a new process's first read: no listing to compare)
        _pending_feed.after_full_read(token)
        return rows
    if mark is not None:
        # (the jobs written since the last read, by index: not a listing of every pending job)
        changes = _pending_feed.changes(mark_sql(Job))
        if changes is not None:
            rows = _pending_versions.read_changes(changes.pending, changes.left, fetch, changes.mark)
            if rows is not None:
                _pending_feed.advance(changes)
                return rows
    token = _pending_feed.before_full_read()
    versions, mark = listing(table, "id", "state = %s", [JobState.PENDING.value], mark=mark_sql(Job))
    rows = _pending_versions.read(versions, fetch, mark)
    _pending_feed.after_full_read(token)
    return rows


def _earlier_service(job_ids: list[int], *, before_attempt: bool = False) -> dict[int, float]:
    """GPU-seconds each of these jobs held in its released allocations: the time each held its GPU
    times the share of it. ``before_attempt``: only those of placements before the job's current
    one (a gang's node that stopped early is still this run)."""
    if not job_ids:
        return {}
    released = Allocation.objects.filter(job_id__in=ids_in(job_ids), released_at__isnull=False)
    if before_attempt:
        released = released.filter(attempt__lt=F("job__attempt"))
    return {job_id: gpu_milli_s / WHOLE_GPU_MILLI
            for job_id, gpu_milli_s in released.order_by().values("job_id").annotate(served=Sum(_held_milli_s()))
            .values_list("job_id", "served")}


def _held_milli_s():
    """An allocation's milli-GPU-seconds: the time it was held times its share of the GPU."""
    return ExpressionWrapper(_seconds_between("created_at", "released_at") * F("gpu_milli"), output_field=FloatField())


SECONDS_PER_DAY = 86400.0


def _seconds_between(start: str, end: str):
    """``end - start`` in seconds, computed by the database (SQLite has no interval type: Julian days)."""
    if connection.vendor == "postgresql":
        return _epoch(end) - _epoch(start)
    return (Func(F(end), function="julianday", output_field=FloatField())
            - Func(F(start), function="julianday", output_field=FloatField())) * Value(SECONDS_PER_DAY)


def _request(row: tuple, slugs: dict[int, str], unfenced: dict[int, bool], core_profiles: dict, models: dict,
             waiting_for: tuple, array_limit: int | None) -> JobRequest:
    (job_id, tenant_id, gpus, submitted_at, gpu_memory_mib, priority, gpu_milli, gpu_models, opportunistic_only,
     shareable, max_nodes, max_runtime_s, profile_key, reserved_since, image, array_id, cpu_milli,
     host_memory_mib, owner_id, mig_profile, accepts_unfenced, attained_gpu_s, _version) = row
    # (47,000 of these in a new process's first cycle: the common case, no profile, without calls)
    if profile_key:
        core_profile, profile = core_profiles.get((tenant_id, profile_key), (None, None))
        expected_runtime_s = _expected_runtime(max_runtime_s, profile)
    else:
        core_profile, expected_runtime_s = None, float(max_runtime_s) if max_runtime_s else None
    allowed_models = models.get(gpu_models)
    if allowed_models is None:
        allowed_models = models[gpu_models] = frozenset(json.loads(gpu_models) or ())
    # (positionally, in REQUEST_FIELDS' order: matching 24 keywords cost 2.5x the call itself)
    return _new_request(
        job_id, slugs[tenant_id], gpus, _seconds(submitted_at), gpu_memory_mib, priority, gpu_milli,
        allowed_models, opportunistic_only, shareable, core_profile, expected_runtime_s, max_nodes, None,
        _seconds(reserved_since), attained_gpu_s, array_id, array_limit, waiting_for, bool(image), cpu_milli,
        host_memory_mib, str(owner_id), mig_profile or None,
        accepts_unfenced if accepts_unfenced is not None else unfenced.get(tenant_id, True),
    )


# (a first cycle builds 47,000 requests: a frozen dataclass's own __init__ was a tenth of it)
_new_request = builder(JobRequest)
# The order ``_request`` passes JobRequest's fields in: a field added or moved fails here, at import,
# not as a request quietly built with one field's value in another.
REQUEST_FIELDS = ("id", "tenant", "gpus", "submitted_at", "gpu_memory_mib", "priority", "gpu_milli", "gpu_models",
                  "opportunistic_only", "shareable", "profile", "expected_runtime_s", "max_nodes", "allreduce_bytes",
                  "reserved_since", "attained_gpu_s", "array_id", "array_limit", "waiting_for", "needs_runtime",
                  "cpu_milli", "host_memory_mb", "user", "mig_profile", "accepts_unfenced")
if tuple(field.name for field in fields(JobRequest)) != REQUEST_FIELDS:
    raise ImportError("JobRequest's fields are not snapshot_loader.REQUEST_FIELDS: update _request and the tuple")


def _accepts_unfenced(job_setting: bool | None, tenant_id: int, unfenced: dict[int, bool]) -> bool:
    """The job's own consent to share an unfenced GPU, else its tenant's (on when unknown: today's behaviour)."""
    return job_setting if job_setting is not None else unfenced.get(tenant_id, True)


def _unfinished_dependencies() -> dict[int, tuple[tuple[int, str], ...]]:
    """Per pending job, the jobs it depends on that have not ended (one query for the whole queue).
    A dependency that ended is dropped here whatever its outcome: cancelling a job whose after_ok
    dependency failed is the lifecycle's business, not the scheduler's."""
    waiting: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for job_id, on_id, kind in (JobDependency.objects.filter(job__state=JobState.PENDING)
                                .exclude(on__state__in=TERMINAL_STATES)
                                .order_by("job_id", "on_id").values_list("job_id", "on_id", "kind")):
        waiting[job_id].append((on_id, kind))
    return {job_id: tuple(deps) for job_id, deps in waiting.items()}


def _expected_runtime(max_runtime_s: int | None, profile: JobProfile | None) -> float | None:
    # (a profile's mean is computed from timestamps; one that is not a finite number was written
    # by something else, and is no estimate)
    if profile and profile.mean_runtime_s and math.isfinite(profile.mean_runtime_s):
        return profile.mean_runtime_s if not max_runtime_s else min(profile.mean_runtime_s, max_runtime_s)
    return float(max_runtime_s) if max_runtime_s else None


def _bounded(peak_mib: int, largest_gpu_mib: int | None) -> int:
    """A profile's peak as the scheduler sees it: never above the largest GPU there is, so a peak a
    node lied into a profile (or one recorded on a GPU since removed) cannot leave its key unplaceable."""
    return min(peak_mib, largest_gpu_mib) if largest_gpu_mib else peak_mib


RUNNING_FIELDS = ("job_id", "gpu_id", "duty_cycle", "memory_limit_mib", "job__tenant_id", "job__run_class",
                  "started_s", "job__gpu_memory_mib", "job__gpu_milli", "job__priority", "job__max_runtime_s",
                  "job__profile_key", "job__shareable", "job__state", "job__checkpoints", "job__array_id",
                  "job__cpu_milli", "job__host_memory_mib", "job__owner_id", "job__accepts_unfenced", "job__attempt")
LIVE_STATES = (JobState.PLACED, JobState.RUNNING)


# The running jobs of the last snapshot, by id: (the allocation rows it was built from, its only
# row or a tuple of them; its usage peak; its profile's inputs; the RunningJob; the nodes it holds
# GPUs on). A job whose rows, peak and profile did not change is the very same object next cycle
# (readings are not part of it: ``LiveReadings``); building 10,000 of them again every cycle was
# most of the loop's snapshot. Valid for the GPUs and tenants it was built with (``_running_for``),
# dropped when they change; replaced by this snapshot's jobs every time, so jobs that ended are
# forgotten.
_running_jobs: dict[int, tuple] = {}
_running_for: tuple = ()
# Elsewhere (SQLite): the live allocations' rows of the last snapshot, kept while neither the
# allocations nor the jobs were written.
_allocation_rows = KeptWhileUnchanged(Allocation, Job)
# PostgreSQL: the live allocations' rows by row version, the allocation's and its job's together
# (the rows joined): after a job is submitted, placed or ends, only the rows written since are read
# again, not every one (28,000 at 8,192 nodes: 0.35 s of PostgreSQL). With the rows in the order
# ``_running`` groups them, as of the read (generation) and the GPUs' indexes that gave them.
_allocation_versions = RowVersions()
_allocations_in_order: tuple = (None, {}, [])
_job_id = itemgetter(0)
# Per running job placed before: (its placement and when it began, the GPU-seconds of its earlier
# runs). Those runs ended before this placement, so the figure holds while it does: read once per
# placement, not per cycle. Replaced by this snapshot's jobs every time.
_served_before: dict[int, tuple[tuple, float]] = {}
# What the last ``_running`` returned and what it was made of: (the allocation rows, their
# profiles' keys, their earlier service, the usage peaks, the profiles' inputs, the result). While
# the rows are the very list kept and the rest compares equal, the same result, without a pass
# over every live allocation (8,000 rows at 1,024 nodes: most of a steady snapshot's Python).
_running_last: tuple | None = None


def _running(gpu_nodes: dict[int, str], gpu_memory: dict[int, int], slugs: dict[int, str],
             unfenced: dict[int, bool],
             gpu_index: dict[int, int]) -> tuple[tuple[RunningJob, ...], dict[int, tuple[str | None, ...]]]:
    """The jobs holding GPUs, and the nodes each holds them on (``gpu_index``: GPU id -> index)."""
    global _running_jobs, _running_for, _running_last
    # Every live allocation holds its GPU, whatever the job's state: a job settled while its
    # node may still run it (timed out by the control plane) keeps its GPUs until the exit.
    # A job's rows come together, its first allocation (by rank, then GPU index) first.
    rows = _live_allocation_rows(gpu_index)
    # (a semi-join, not thousands of ids as parameters: psycopg parses each in Python)
    held = Allocation.objects.filter(released_at__isnull=True).values("job_id")
    peaks = dict(JobUsage.objects.filter(job_id__in=held).values_list("job_id", "peak_gpu_memory_mib"))
    last = _running_last
    same_rows = last is not None and last[0] is rows  # (the very rows kept: nothing written since)
    profile_keys = last[1] if same_rows else {(row[4], row[11]) for row in rows if row[11]}
    profiles = _profiles(profile_keys)
    profile_inputs = _profile_inputs(profiles)
    served = last[2] if same_rows else _served_in_earlier_runs(rows)
    context = (gpu_nodes, gpu_memory, slugs, unfenced)
    if same_rows and last[3] == peaks and last[4] == profile_inputs and _running_for == context:
        return last[5]
    before = _running_jobs if _running_for == context else {}
    running, held_on, kept = [], {}, {}
    for job_id, group in groupby(rows, _job_id):
        group = list(group)
        first = group[0]
        built_from = first if len(group) == 1 else tuple(group)
        peak = peaks.get(job_id)
        inputs = profile_inputs.get((first[4], first[11])) if first[11] else None
        entry = before.get(job_id)
        attained = served.get(job_id, 0.0)
        if (entry is None or entry[0] != built_from or entry[1] != peak or entry[2] != inputs
                or entry[3].attained_gpu_s != attained):
            held = tuple(row[1] for row in group)
            held_mib = (gpu_memory.get(held[0], 0) if len(held) == 1
                        else max(gpu_memory.get(g, 0) for g in held)) or None
            profile = profiles.get((first[4], first[11])) if first[11] else None
            entry = (built_from, peak, inputs,
                     _running_job(first, held, peak, profile, held_mib, slugs, unfenced, attained),
                     tuple(gpu_nodes.get(g) for g in held))
        kept[job_id] = entry
        running.append(entry[3])
        held_on[job_id] = entry[4]
    _running_jobs, _running_for = kept, context
    _running_last = (rows, profile_keys, served, peaks, profile_inputs, (tuple(running), held_on))
    return _running_last[5]


def _live_allocations():
    return (Allocation.objects.filter(released_at__isnull=True)
            .annotate(started_s=_epoch(Coalesce("job__started_at", "job__placed_at", "job__submitted_at"))))


# (a job's allocations in rank order, then by GPU index; the allocation's id where those tie)
_ALLOCATION_ORDER = ("job_id", "rank", "gpu__index", "id")


def _live_allocation_rows(gpu_index: dict[int, int]) -> list[tuple]:
    """The live allocations' RUNNING_FIELDS, a job's rows together, in ``_ALLOCATION_ORDER``
    (``gpu_index``: GPU id -> index, as the nodes were read): while nothing was written to the
    allocations, the jobs or the GPUs, the very list of the last call."""
    global _allocations_in_order, _allocation_versions
    if connection.vendor != "postgresql":
        return _allocation_rows.get(
            lambda: list(_live_allocations().order_by(*_ALLOCATION_ORDER).values_list(*RUNNING_FIELDS)))
    allocation_mark, job_mark = marks([Allocation, Job])
    allocations, jobs = (connection.ops.quote_name(model._meta.db_table) for model in (Allocation, Job))
    # (a row this transaction wrote, either of the two, reads as its own version, which
    # RowVersions never keeps: the transaction may write it again under the same one)
    own = "(SELECT mod(txid_current_if_assigned(), 4294967296)::text)"
    version = (f"CASE WHEN {own} IN ({allocations}.xmin::text, {jobs}.xmin::text) THEN {own} "
               f"ELSE {allocations}.xmin::text || '.' || {jobs}.xmin::text END")

    def fetch(ids: list[str] | None):
        # (each row with its order but for the GPU's index, which is the GPU row's: by ``gpu_index``)
        live = _live_allocations() if ids is None else _live_allocations().filter(id__in=ids_in(ids))
        read = _rows(live.annotate(row_version=RawSQL(version, ()))
                     .values_list(*RUNNING_FIELDS, "job_id", "rank", "id", "row_version"))
        last = len(RUNNING_FIELDS)
        return ((row[-2], row[-1], (row[last:-1], row[:last])) for row in read)

    if None in (allocation_mark, job_mark):
        # This transaction wrote one of the tables (inside a savepoint its rows carry the
        # savepoint's id, which no version check recognises), or their triggers are missing: read
        # every row, keep none.
        _allocation_versions = RowVersions()
        values = {row_id: value for row_id, _, value in fetch(None)}
        generation = None
    else:
        values = _allocation_versions.unchanged(f"{allocation_mark}/{job_mark}")
        if values is None and _allocation_versions.never_read:
            values = _allocation_versions.read_every(fetch)
        elif values is None:
            with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                steady_scan_order(cursor)
                cursor.execute(
                    f"SELECT string_agg({allocations}.id::text || ':' || {version}, ','), "
                    f"{mark_sql(Allocation)} || '/' || {mark_sql(Job)} FROM {allocations} "
                    f"JOIN {jobs} ON {jobs}.id = {allocations}.job_id WHERE {allocations}.released_at IS NULL")
                listed, mark = cursor.fetchone()
            values = _allocation_versions.read(listed or "", fetch, mark)
        generation = _allocation_versions.generation
    kept = _allocations_in_order
    if generation is None or kept[0] != generation or not (kept[1] is gpu_index or kept[1] == gpu_index):
        index_of = gpu_index.get
        _allocations_in_order = (generation, gpu_index, [row for _, row in sorted(
            values.values(), key=lambda entry: (entry[0][0], entry[0][1], index_of(entry[1][1], -1), entry[0][2]))])
    return _allocations_in_order[2]


def _served_in_earlier_runs(rows: list[tuple]) -> dict[int, float]:
    """Per running job placed before (``rows``: its live allocations' RUNNING_FIELDS), the
    GPU-seconds its earlier runs had: one query for the jobs placed since the last snapshot, if any."""
    global _served_before
    # (each placement counts one, the first is 1; with its start, so that a job id used again, by a
    # transaction rolled back on SQLite, is not taken for the same run)
    placements = {row[0]: (row[-1], row[6]) for row in rows if row[-1] > 1}
    before = _served_before
    kept = {job_id: before[job_id] for job_id, placement in placements.items()
            if job_id in before and before[job_id][0] == placement}
    if len(kept) < len(placements):
        new = [job_id for job_id in placements if job_id not in kept]
        served = _earlier_service(new, before_attempt=True)
        kept.update((job_id, (placements[job_id], served.get(job_id, 0.0))) for job_id in new)
    _served_before = kept
    return {job_id: gpu_s for job_id, (_, gpu_s) in kept.items()}


def _running_job(row: tuple, held: tuple[int, ...], peak_mib: int | None, profile: JobProfile | None,
                 held_mib: int | None, slugs: dict[int, str], unfenced: dict[int, bool],
                 attained_gpu_s: float) -> RunningJob:
    (job_id, _, duty_cycle, memory_limit_mib, tenant_id, run_class, started_at, gpu_memory_mib, gpu_milli, priority,
     max_runtime_s, _, shareable, state, checkpoints, array_id, cpu_milli, host_memory_mib, owner_id,
     accepts_unfenced, _) = row
    return _new_running_job(
        id=job_id, tenant=slugs[tenant_id],
        job_class=JobClass.OPPORTUNISTIC if run_class == RunClass.OPPORTUNISTIC else JobClass.GUARANTEED,
        gpu_ids=held,
        started_at=_seconds(started_at),
        memory_mib=_memory_estimate(peak_mib, memory_limit_mib, gpu_memory_mib, profile, held_mib),
        gpu_milli=gpu_milli, priority=priority,
        expected_runtime_s=_expected_runtime(max_runtime_s, profile),
        duty_cycle=duty_cycle,
        solo_utilisation=profile.mean_util if profile else None,
        shareable=shareable,
        preempting=state not in LIVE_STATES,
        attained_gpu_s=attained_gpu_s,
        checkpoints=checkpoints,
        array_id=array_id,
        cpu_milli=cpu_milli,
        host_memory_mb=host_memory_mib,
        user=str(owner_id),
        accepts_unfenced=_accepts_unfenced(accepts_unfenced, tenant_id, unfenced),
    )


_new_running_job = builder(RunningJob)


def _memory_estimate(observed_peak_mib: int | None, memory_limit_mib: int | None, gpu_memory_mib: int | None,
                     profile: JobProfile | None, held_gpu_mib: int | None = None) -> int | None:
    """Per-GPU memory the job holds: observed peak, else its limit, request or profile; None = all.
    Never more than the largest GPU it holds (``held_gpu_mib``): node-reported peaks are untrusted."""
    if observed_peak_mib:
        return _bounded(observed_peak_mib, held_gpu_mib)
    return memory_limit_mib or gpu_memory_mib or (
        _bounded(profile.peak_gpu_memory_mib, held_gpu_mib) if profile else None)


def _live_job_utilisation(samples: dict[str, live.NodeUse], held_on: dict[int, tuple[str | None, ...]]
                          ) -> dict[int, float]:
    """Each job's mean live utilisation, from the nodes it holds GPUs on only (``held_on``: job ->
    those nodes): what another node says about it (a bug, or a node lying) must not move its
    throttling."""
    mean: dict[int, float] = {}
    several: dict[int, list[float]] = {}  # (most jobs have one GPU: one reading, its own mean)
    nowhere = ()
    for node, sample in samples.items():
        for usage in sample.jobs:
            if usage.util_sm is not None and node in held_on.get(job_id := usage.job_id, nowhere):
                if job_id in mean:
                    several.setdefault(job_id, [mean[job_id]]).append(usage.util_sm / 100.0)
                else:
                    mean[job_id] = usage.util_sm / 100.0
    for job_id, values in several.items():
        mean[job_id] = sum(values) / len(values)
    return mean
