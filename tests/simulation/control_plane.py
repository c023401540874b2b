"""The control plane under simulation: the real Django services against fakeredis (with Lua, for
the fan-in's compare-and-set script) on the simulated clock, in the database the caller provides
(pytest-django's test database, or the bench's own), inside one transaction the caller rolls back.

One worker tick does what the worker's beat does: agent events (fan-in, then
:func:`jobs.services.agent_events.consume_events`), metric ingest (fan-in, live samples), node
health (:func:`jobs.services.node_health.check_node_health`) and a scheduling cycle
(:func:`jobs.services.scheduling_loop.run_scheduling_cycle`). Commands go out in on-commit
callbacks, which run at the end of each step (the simulation's transaction never commits).
"""

from __future__ import annotations

import redis
from django.contrib.auth import get_user_model
from django.test import TestCase

from jobs.choices import JobState
from jobs.models import Job, Tenant
from jobs.scheduling.carry import Carry
from jobs.services.service_meter import ServiceMeter
from jobs.services import agent_events, apply, node_health, nudge, scheduling_loop, snapshot_loader
from jobs.services import commands, lifecycle, launch_failures, profiles  # noqa: F401  (imported before the clock is patched)
from jobs.services.row_versions import RowVersions
from monitoring.services import fanin, health, ingest, live, redis_client, registry  # noqa: F401

FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
ON_COMMIT = TestCase.captureOnCommitCallbacks


def isolate(monkeypatch, client, world) -> None:
    """Point the services at ``client`` and give them fresh process state (nothing carried over
    from another seed run in this process)."""
    monkeypatch.setattr(redis_client, "_client", lambda url: client)
    monkeypatch.setattr(scheduling_loop, "_carry", Carry())
    monkeypatch.setattr(scheduling_loop, "_service", ServiceMeter())
    monkeypatch.setattr(scheduling_loop, "_held", scheduling_loop._Held())
    monkeypatch.setattr(scheduling_loop, "_cycles_unchecked", 0)
    monkeypatch.setattr(apply, "_verdict_versions", RowVersions())
    monkeypatch.setattr(snapshot_loader, "_pending_versions", RowVersions(ordered=True))
    # A nudge queues a Celery task in production; here it asks the world for a cycle soon.
    monkeypatch.setattr(agent_events, "nudge_scheduler", world.nudge)
    monkeypatch.setattr(nudge, "nudge_scheduler", world.nudge)
    from django.core.cache import cache

    cache.clear()


class ControlPlane:
    def __init__(self, client, clock, trace, node_lost):
        self.client, self.clock, self.trace, self.node_lost = client, clock, trace, node_lost
        self.ingestor = None
        self.next_health = 0.0

    def restart(self) -> None:
        """A fresh worker process: nothing kept in memory from the last one."""
        self.ingestor = None
        scheduling_loop._carry = Carry()
        scheduling_loop._held = scheduling_loop._Held()

    def submit(self, tenant: Tenant, owner, name: str) -> Job:
        return Job.objects.create(tenant=tenant, owner=owner, name=name, command=["train"], gpus=1)

    @staticmethod
    def tenant_and_owner(gpus: int):
        tenant = Tenant.objects.create(slug="sim", name="Sim", guaranteed_gpus=gpus, max_gpus=gpus)
        owner = get_user_model().objects.create(username="simulated")
        return tenant, owner

    def tick(self, *, cycle: bool = True) -> None:
        """One beat of the worker; a Redis error ends the step it hit, as a failed task would."""
        for name, step in (("events", self._events), ("ingest", self._ingest), ("health", self._health),
                           ("cycle", self._cycle if cycle else None)):
            if step is None:
                continue
            try:
                with ON_COMMIT(execute=True):
                    step()
            except redis.RedisError as exc:
                self.trace(f"worker {name}: redis error {exc!r}"[:200])

    def _events(self) -> None:
        agent_events.consume_events(self.client)

    def _ingest(self) -> None:
        if self.ingestor is None:
            self.ingestor = ingest.Ingestor(self.client, consumer="sim-ingest", clock=self.clock.time)
        self.ingestor.run_once()

    def _health(self) -> None:
        if self.clock.now < self.next_health:
            return
        self.next_health = self.clock.now + 2.0
        outcome = node_health.check_node_health(self.client)
        for node in outcome["lost"]:
            self.node_lost(node)
        if outcome["lost"] or outcome["revived"] or outcome["vanished"] or outcome["strays_stopped"]:
            self.trace(f"health: {outcome}")

    def _cycle(self) -> None:
        result = scheduling_loop.run_scheduling_cycle()
        if result.placed or result.preempted:
            self.trace(f"cycle: placed {result.placed}, preempted {result.preempted}")
