"""Bounded reservations against gang starvation, and who may backfill them.

The exact rule:

1. **Holder.** In each cycle, the first gang (``gpus >= 2``) in scheduling order that fits the
   inventory and its quota but finds no GPUs (and, if guaranteed, cannot reclaim any) becomes the
   holder, if its window allows. One holder per cycle. Guaranteed jobs come before borrowing in
   the order, so a borrowing gang's reservation never delays guaranteed work placed before it.
2. **Window.** A holder keeps holding for ``gang_reservation_max_s`` from ``reserved_since``
   (which the service stores from ``Reservation.since``), then must wait as long again before it
   may hold again, so that a gang whose nodes never drain cannot idle them forever. No
   ``reserved_since`` (or one older than twice the window) starts a new window now. A window of
   0 switches reservations off.
3. **Nodes.** The holder takes the node that can give it its GPUs soonest: earliest time at which
   enough of its GPUs are empty (from residents' expected ends; unknown counts as never), then
   most empty GPUs now. A gang wider than any node takes the nodes with the most usable GPUs (most
   empty first) until they cover it. Held nodes leave every index: nothing new lands there.
4. **Backfill.** A later job may still use held nodes if it declares ``expected_runtime_s`` and
   would end before the holder's ETA (known only when every GPU it waits for has an expected
   end). Jobs without a runtime never backfill held nodes.
"""

from __future__ import annotations

import math

from jobs.scheduling.capacity import Capacity, GpuSlot, NodeSlot
from jobs.scheduling.placement import Placer, Shape
from jobs.scheduling.snapshot import JobRequest


def window(job: JobRequest, now: float, max_s: float) -> tuple[float, float] | None:
    """(since, until) of the job's holding window if it may hold now, None while cooling down or
    when reservations are off (``max_s`` 0)."""
    if max_s <= 0:
        return None
    since = job.reserved_since
    if since is None or now >= since + 2 * max_s or since > now:
        since = now
    elif now >= since + max_s:
        return None
    return since, since + max_s


def _vacate_time(gpu: GpuSlot, now: float, leaving: set[int]) -> float:
    """When the GPU should be empty: its last resident's expected end (inf when unknown)."""
    if gpu.blocked:  # held by something unknown: it ends, but nobody knows when
        return math.inf
    latest = now
    for job in gpu.residents:
        if job.id in leaving:
            continue
        runtime = job.expected_runtime_s  # (``expected_end`` spelled out: called for every GPU held)
        if runtime is None:
            return math.inf
        end = job.started_at + runtime
        if end > latest:
            latest = end
    if gpu.occupants > len(gpu.residents):  # placed this cycle: no known end
        return math.inf
    return latest


def nodes_to_hold(capacity: Capacity, placer: Placer, shape: Shape, now: float,
                 leaving: set[int]) -> tuple[list[NodeSlot], float | None] | None:
    """The nodes to hold and the estimated seconds until the gang fits on them: GPUs of one model,
    like the gang itself (fewest nodes first, then the soonest)."""
    best = None
    for model_pools in placer.pools_by_model(placer.pools_for(shape)):
        found = _nodes_to_hold_of(capacity, model_pools, shape, now, leaving)
        if found is None:
            continue
        if best is None or (len(found[0]), _eta_key(found[1])) < (len(best[0]), _eta_key(best[1])):
            best = found
    return best


def _eta_key(eta: float | None) -> float:
    return math.inf if eta is None else eta


def _nodes_to_hold_of(capacity: Capacity, pools: list[int], shape: Shape, now: float,
                     leaving: set[int]) -> tuple[list[NodeSlot], float | None] | None:
    n = shape.gpus
    wanted = set(pools)
    options = []
    for node in capacity.nodes:
        if not node.indexed or (node.pool is not None and node.pool not in wanted):
            continue
        times = [0.0 if g.occupants == 0 and not g.blocked else _vacate_time(g, now, leaving) - now
                 for g in node.gpus if g.pool in wanted and not g.promised]
        if not times:
            continue
        times.sort()
        options.append((node, times))
    if not options:
        return None
    fitting = [(times[n - 1], -times.count(0.0), node.key, node) for node, times in options if len(times) >= n]
    if fitting:
        eta, _, _, node = min(fitting)
        return [node], None if math.isinf(eta) else eta
    if shape.max_nodes == 1:
        return None
    options.sort(key=lambda o: (-len(o[1]), -o[1].count(0.0), o[0].key))
    chosen, eta, covered = [], 0.0, 0
    for node, times in options:
        take = min(len(times), n - covered)
        chosen.append(node)
        eta = max(eta, times[take - 1])
        covered += take
        if covered >= n:
            return chosen, None if math.isinf(eta) else eta
    return None


def may_backfill(job: JobRequest, holder_eta_s: float | None) -> bool:
    return job.expected_runtime_s is not None and holder_eta_s is not None and job.expected_runtime_s <= holder_eta_s
