"""The scheduling loop freezes what lives on after each cycle (the collector passes over it) and
collects everything every FULL_COLLECTION_EVERY cycles: garbage in reference cycles made during a
cycle lives no longer than that."""

import gc
import weakref

from agents import protocol
from jobs.services import scheduling_loop
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


class Knot:
    """Garbage only the collector can free: it refers to itself."""

    def __init__(self):
        self.itself = self


def test_garbage_in_reference_cycles_made_by_a_cycle_is_freed_within_the_full_collection_interval(
        db, redis_client, live_redis, monkeypatch):
    GpuFactory(node=NodeFactory(name="n1"), index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    JobFactory(tenant=TenantFactory(slug="vision"))
    monkeypatch.setattr(scheduling_loop, "FULL_COLLECTION_EVERY", 3)
    monkeypatch.setattr(scheduling_loop, "_cycles_since_collection", 0)
    knots = []
    build = scheduling_loop.build_snapshot

    def build_and_tie_a_knot(client):
        knot = Knot()
        knots.append(weakref.ref(knot))
        return build(client)

    monkeypatch.setattr(scheduling_loop, "build_snapshot", build_and_tie_a_knot)
    try:
        scheduling_loop.run_scheduling_cycle()
        assert gc.get_freeze_count() > 0  # (what lived on after the cycle is frozen)
        gc.collect()
        assert knots[0]() is not None  # frozen: an ordinary collection passes over it
        scheduling_loop.run_scheduling_cycle()
        scheduling_loop.run_scheduling_cycle()  # (the third: everything thawed and collected)
        assert [knot() for knot in knots] == [None, None, None]
    finally:
        gc.unfreeze()
