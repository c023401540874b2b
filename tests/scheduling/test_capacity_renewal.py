"""A carried working copy of the capacity, renewed for the next cycle (``Capacity.renew``), is in
every field, index and order what a new one built from that cycle's snapshot is: over random
histories (placements launched, jobs ending, preemptions, cordons, nodes lost, config changes) and
readings that move between cycles, whatever the cycle before did to it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling import ClusterSnapshot, decide
from jobs.scheduling import capacity as capacity_module
from jobs.scheduling.capacity import Capacity
from jobs.scheduling.carry import Carry
from jobs.scheduling.snapshot import LiveReadings
from tests.scheduling.builders import cluster, job, node, readings, running, tenant
from tests.scheduling.test_carry import CONFIGS, EVENTS, advance
from tests.scheduling.test_invariants import nodes, requests, tenants, warm_clusters

GPU_FIELDS = [name for name in capacity_module.GpuSlot.__slots__ if name not in ("node", "residents")]
NODE_FIELDS = [name for name in capacity_module.NodeSlot.__slots__ if name not in ("gpus", "empty")]


def state(capacity: Capacity) -> dict:
    """Everything a cycle reads of a working copy, in the order it reads it."""
    return {
        "gpus": [(tuple(getattr(gpu, name) for name in GPU_FIELDS), gpu.node.key, [id(j) for j in gpu.residents])
                 for gpu in capacity.gpus],
        "nodes": [(tuple(getattr(node, name) for name in NODE_FIELDS), [g.key for g in node.gpus],
                   [g.key for g in node.empty]) for node in capacity.nodes],
        "indexes": (capacity.opp_index, capacity.guar_index, capacity.req_index),
        "buckets": [[list(bucket) for bucket in pool] for pool in capacity.buckets],
        "mixed": [node.key for node in capacity.mixed_nodes],
        "rest": (capacity.pools, capacity.start_total_empty, capacity.max_node_gpus, sorted(capacity.by_id)),
    }


@st.composite
def new_readings(draw, snapshot: ClusterSnapshot) -> LiveReadings:
    """Readings of some GPUs and some running jobs moved, appeared or went."""
    gpus, used, jobs = (dict(snapshot.readings.gpus), dict(snapshot.readings.gpu_memory_used_mib),
                        dict(snapshot.readings.jobs))
    for gpu in draw(st.lists(st.sampled_from([g.id for n in snapshot.nodes for g in n.gpus]), max_size=3)):
        gpus[gpu] = draw(st.floats(0, 1))
        if draw(st.booleans()):
            used[gpu] = draw(st.integers(0, 90_000))
        elif draw(st.booleans()):
            gpus.pop(gpu)
            used.pop(gpu, None)
    if snapshot.running:
        for job_id in draw(st.lists(st.sampled_from([j.id for j in snapshot.running]), max_size=3)):
            if draw(st.booleans()):
                jobs[job_id] = draw(st.floats(0, 1))
            else:
                jobs.pop(job_id, None)
    return LiveReadings(gpus=gpus, gpu_memory_used_mib=used, jobs=jobs)


@pytest.fixture
def renew_everything(monkeypatch):
    """Clusters of a few nodes: let a renewal build any share of them again."""
    monkeypatch.setattr(capacity_module, "RENEW_AT_MOST", 1.0)


def _history(draw, snapshot: ClusterSnapshot, cycles: int, next_id: int, events: list[str]) -> None:
    carry, config, now = Carry(), CONFIGS[0], 1000.0
    for _ in range(cycles):
        kept = carry.capacity
        renewed = carry.capacity_for(snapshot, config)
        assert state(renewed) == state(Capacity(snapshot, config))
        decisions = decide(snapshot, now, config, carry)
        assert carry.capacity is renewed  # (the cycle took the copy just renewed)
        assert decisions == decide(snapshot, now, config)
        snapshot, config, now, next_id = advance(draw, snapshot, decisions, events, config, now, next_id)
        if draw(st.booleans()):
            snapshot = dataclasses.replace(snapshot, readings=draw(new_readings(snapshot)))
        if draw(st.integers(0, 4)) == 0:  # (no loader does, but each GPU lists residents in this order)
            snapshot = dataclasses.replace(snapshot, running=tuple(draw(st.permutations(snapshot.running))))
        del kept


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_renewed_working_copy_is_what_a_new_one_would_be(renew_everything, data):
    draw = data.draw
    node_states = draw(nodes())
    snapshot = ClusterSnapshot(nodes=tuple(node_states), tenants=tuple(draw(tenants())), pending=(),
                               readings=readings(node_states))
    names = [t.name for t in snapshot.tenants] + ["stranger"]
    snapshot = dataclasses.replace(snapshot, pending=tuple(draw(requests(1, names, 12))))
    _history(draw, snapshot, draw(st.integers(2, 7)), 100, EVENTS + ["launch"] * 2)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_renewed_working_copy_of_a_borrowed_cluster_is_what_a_new_one_would_be(renew_everything, data):
    """Mostly borrowed clusters: reclaims promise GPUs, victims take their grace to stop."""
    _history(data.draw, data.draw(warm_clusters()), data.draw(st.integers(2, 6)), 5000, EVENTS + ["launch"] * 4)


def _busy_cluster() -> ClusterSnapshot:
    return cluster(
        *(node(f"n{i}", gpus=4) for i in range(32)),
        tenants=[tenant("nlp", guaranteed=8), tenant("cv", guaranteed=4, max_gpus=32)],
        running=[running(100 + i, on=f"n{i}", gpus=[0, 1], tenant="nlp") for i in range(4)],
        pending=[job(1, tenant="cv", gpus=4), job(2, tenant="cv", gpus=8), job(3, tenant="nlp", milli=500)])


def test_a_steady_cycle_builds_again_only_the_nodes_that_moved(monkeypatch):
    """Nothing changed but one job's reading: the next cycle builds that job's node again, and
    the nodes the cycle before placed on, not the cluster."""
    snapshot = _busy_cluster()
    carry = Carry()
    decisions = decide(snapshot, 1000.0, carry=carry)
    placed_on = {gpu for placement in decisions.placements for gpu in placement.gpu_ids}
    built: list[str] = []
    rebuild = Capacity._rebuild
    monkeypatch.setattr(Capacity, "_rebuild", lambda self, dirty, *rest: (
        built.extend(sorted(node.name for node in dirty)), rebuild(self, dirty, *rest))[1])
    moved = dataclasses.replace(snapshot, readings=LiveReadings(jobs={103: 0.4}))
    assert decide(moved, 1002.0, carry=carry) == decide(moved, 1002.0)
    touched = {g.node.name for g in carry.capacity.gpus if g.id in placed_on}
    assert placed_on and set(built) == touched | {"n3"}


def test_running_jobs_listed_in_another_order_or_twice_are_a_new_copy_not_a_renewal():
    snapshot = _busy_cluster()
    carry = Carry()
    decide(snapshot, 1000.0, carry=carry)
    first = carry.capacity
    for jobs in (snapshot.running[::-1], snapshot.running + snapshot.running[:1]):
        changed = dataclasses.replace(snapshot, running=jobs)
        assert state(carry.capacity_for(changed, CONFIGS[0])) == state(Capacity(changed, CONFIGS[0]))
        assert carry.capacity is not first
        first = carry.capacity


def test_a_changed_inventory_or_config_builds_a_new_copy():
    snapshot = _busy_cluster()
    carry = Carry()
    decide(snapshot, 1000.0, carry=carry)
    first = carry.capacity
    decide(snapshot, 1002.0, carry=carry)
    assert carry.capacity is first  # (renewed)
    cordoned = dataclasses.replace(snapshot, nodes=(dataclasses.replace(snapshot.nodes[0], cordoned=True),
                                                    *snapshot.nodes[1:]))
    assert decide(cordoned, 1004.0, carry=carry) == decide(cordoned, 1004.0)
    assert carry.capacity is not first
    second = carry.capacity
    config = dataclasses.replace(CONFIGS[0], share_memory_headroom_mib=0)
    assert decide(cordoned, 1006.0, config, carry) == decide(cordoned, 1006.0, config)
    assert carry.capacity is not second
