"""The seeded world: an event loop on the simulated clock that runs the control plane
(:mod:`tests.simulation.control_plane`) and the nodes (:mod:`tests.simulation.sim_node`) against
one fakeredis server, injects faults, and checks :mod:`tests.simulation.invariants` after every
event. Every choice comes from one ``random.Random(seed)``: a seed replays the same run.

Faults, all within the first ``FAULT_WINDOW_S`` seconds (then everything heals, and time runs on
until every job is final or ``SETTLE_S`` more have passed):

- network, on what crosses between the control plane and the agents: a command (the control
  plane's XADD onto a node's command stream) is delayed, lost, or delivered again later, so
  commands arrive reordered; an agent's XADD fails before it lands or lands and loses its reply
  (the agent sends it again: a duplicate), and a read's reply is lost (the entries wait pending);
  a partition cuts a node off Redis for a while;
- process: an agent is killed (its jobs run on under their supervisors) and restarted, or paused
  (SIGSTOP) and continued; the worker is paused or killed (a fresh one, nothing kept in memory);
  Redis is lost (restarted empty: every stream, group, heartbeat and key gone).

Agent authentication (signing) is off in the simulation: messages and commands go unsigned.
"""

from __future__ import annotations

import heapq
import itertools
import random
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import fakeredis
import pytest
import redis
from django.test import override_settings

from agents import protocol
from jobs.services import commands as command_service
from tests.simulation import invariants
from tests.simulation.control_plane import FINAL, ControlPlane, isolate
from tests.simulation.sim_clock import EPOCH, SimClock, patch_time
from tests.simulation.sim_node import SimAgent, SimRunner

FAULT_WINDOW_S = 240.0
SETTLE_S = 900.0
AGENT_INTERVAL_S = 2.0
WORKER_INTERVAL_S = 2.0
# A scheduling cycle runs every this many worker ticks, and at the next tick after a nudge (a
# submission, or GPUs freed), as the beat and the nudges drive it.
CYCLE_EVERY_TICKS = 3
COMMAND_PREFIX = "colony:node:"


@dataclass
class Config:
    nodes: int = 3
    gpus_per_node: int = 2
    jobs: int = 8
    faults: bool = True


@dataclass
class Outcome:
    seed: int
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    ended_at: float = 0.0
    events: int = 0
    final_states: dict[int, str] = field(default_factory=dict)
    excused: int = 0  # jobs run to their end again because their node was lost (see invariants.excused)

    @property
    def ok(self) -> bool:
        return not self.violations


class ControlPlaneLink:
    """The control plane's Redis client: commands cross the (faulty) network, the rest is direct."""

    def __init__(self, client, network):
        self._client, self._network = client, network

    def xadd(self, name, fields, *args, **kwargs):
        if _is_command_stream(name):
            self._network.send_command(name, fields)
            return b"0-1"
        return self._client.xadd(name, fields, *args, **kwargs)

    def pipeline(self, *args, **kwargs):
        # The real pipeline (scripts queued on it are loaded only for one), its XADDs onto command
        # streams diverted to the network.
        pipe = self._client.pipeline(*args, **kwargs)
        direct = pipe.xadd

        def xadd(name, fields, *args, **kwargs):
            if not _is_command_stream(name):
                return direct(name, fields, *args, **kwargs)
            self._network.send_command(name, fields)
            return pipe

        pipe.xadd = xadd
        return pipe

    def __getattr__(self, name):
        return getattr(self._client, name)


class AgentLink:
    """A node's connection to Redis: cut during a partition; writes and reads may lose their reply."""

    def __init__(self, client, world, node: str):
        self._client, self._world, self._node = client, world, node

    def _reachable(self):
        if self._world.partitioned(self._node):
            raise redis.ConnectionError(f"{self._node} is partitioned from Redis")

    def xadd(self, name, fields, *args, **kwargs):
        self._reachable()
        roll = self._world.network_roll()
        if roll < 0.02:
            raise redis.ConnectionError("write lost on the way")
        entry = self._client.xadd(name, fields, *args, **kwargs)
        if roll < 0.04:
            raise redis.ConnectionError("reply lost on the way (the write landed)")
        return entry

    def xreadgroup(self, *args, block=None, **kwargs):
        self._reachable()
        reply = self._client.xreadgroup(*args, **kwargs)  # (never blocks: the world moves the clock)
        if reply and self._world.network_roll() < 0.02:
            raise redis.ConnectionError("read reply lost on the way (its entries wait pending)")
        return reply

    def __getattr__(self, name):
        self._reachable()
        return getattr(self._client, name)


def _is_command_stream(name) -> bool:
    name = name.decode() if isinstance(name, bytes) else name
    return name.startswith(COMMAND_PREFIX) and name.endswith(":commands")


class World:
    def __init__(self, seed: int, config: Config | None = None, *, verbose: bool = False, workdir: Path | None = None):
        self.seed, self.config, self.verbose = seed, config or Config(), verbose
        self.rng = random.Random(seed)
        self._ids = random.Random(f"ids-{seed}")  # command ids: drawn apart, so they shift no fault
        self.clock = SimClock()
        self.outcome = Outcome(seed)
        self._queue: list = []
        self._seq = itertools.count()
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="colony-sim-"))
        self.server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeRedis(server=self.server)
        self.control_plane = None
        self.nodes = [f"sim{i}" for i in range(self.config.nodes)]
        self.runners: dict[str, SimRunner] = {}
        self.agents: dict[str, SimAgent | None] = {}
        self.paused: dict[str, float] = {}  # node or "worker" -> until when
        self.partitions: dict[str, float] = {}
        self.completions: dict[int, list] = {}
        self.lost_at: dict[str, list[float]] = {}  # node -> when the control plane declared it LOST
        self.exit_delivered_at: dict[tuple[int, str], float] = {}  # (job, launch) -> exit first in Redis
        self.launch_delivered_at: dict[str, float] = {}  # launch command id -> first in its node's stream
        self._work: dict[int, tuple[float, int]] = {}
        self._nudged = False
        self._ticks = 0
        self.faults_on = self.config.faults

    # -- the world's randomness, in one place
    def network_roll(self) -> float:
        return self.rng.random() if self.faults_on else 1.0

    def job_work(self, job_id: int) -> tuple[float, int]:
        """A job's own duration and exit code: the same for every run of it."""
        if job_id not in self._work:
            self._work[job_id] = (round(self.rng.uniform(15, 150), 1), self.rng.choice((0, 0, 0, 0, 1, 2)))
        return self._work[job_id]

    def stop_delay(self, grace_s: float) -> float:
        return round(self.rng.uniform(0.1, min(grace_s, 3.0)), 2)

    # -- the event queue
    def at(self, when: float, what: str, *args) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), what, args))

    def wake_at(self, when: float) -> None:
        self.at(when, "wake")

    def trace(self, text: str) -> None:
        line = f"[{self.clock.now - EPOCH:8.2f}] {text}"
        self.outcome.trace.append(line)
        if self.verbose:
            print(line)

    def nudge(self) -> None:
        self._nudged = True

    def partitioned(self, node: str) -> bool:
        return self.partitions.get(node, 0.0) > self.clock.now

    # -- process hooks (ground truth)
    def process_started(self, process) -> None:
        self.trace(f"{process.node}: {process.launch.command_id} starts on GPU {list(process.gpu_indices)}")

    def process_ended(self, process) -> None:
        how = f"ran to its end, exit {process.exit_code}" if process.ran_to_end else "stopped"
        self.trace(f"{process.node}: {process.launch.command_id} ends ({how})")
        if process.ran_to_end:
            self.completions.setdefault(process.job_id, []).append(process)

    def node_lost(self, node: str) -> None:
        self.lost_at.setdefault(node, []).append(self.clock.now)

    def exit_delivered(self, message) -> None:
        if not message.absent:  # ("this node does not know that attempt" tells of no exit)
            self.exit_delivered_at.setdefault((message.job_id, message.launch_id), self.clock.now)

    # -- the network
    def send_command(self, stream, fields) -> None:
        fields = dict(fields)
        command = protocol.decode_command(fields)
        roll = self.network_roll()
        if roll < 0.03:
            self.trace(f"net: {command.kind} {command.command_id} to {stream} lost")
            return
        delay = self.rng.uniform(0.0, 3.0) if roll < 0.35 else 0.0
        self.at(self.clock.now + delay, "deliver", stream, fields)
        if self.network_roll() < 0.06:
            again = self.rng.uniform(2.0, 25.0)
            self.trace(f"net: {command.kind} {command.command_id} will be delivered again in {again:.1f}s")
            self.at(self.clock.now + again, "deliver", stream, fields)

    # -- running
    def run(self, monkeypatch) -> Outcome:
        patch_time(self.clock, monkeypatch)
        monkeypatch.setattr(command_service, "uuid", _SeededUuid(self._ids))
        link = ControlPlaneLink(self.redis, self)
        isolate(monkeypatch, link, self)
        with override_settings(COLONY_AGENT_AUTH="off", COLONY_AGENT_SECRET="", REDIS_URL="redis://simulated/0"):
            self.control_plane = ControlPlane(link, self.clock, self.trace, self.node_lost)
            self._setup()
            self._loop()
        return self.outcome

    def _setup(self) -> None:
        config = self.config
        tenant, owner = ControlPlane.tenant_and_owner(config.nodes * config.gpus_per_node)
        self._tenant, self._owner = tenant, owner
        self.jobs = []
        for node in self.nodes:
            self.runners[node] = SimRunner(node, self, self._workdir / node)
            self.agents[node] = None
            self.at(self.clock.now + self.rng.uniform(0, 2), "agent_start", node)
        self.at(self.clock.now + 1.0, "worker")
        for index in range(config.jobs):
            self.at(self.clock.now + self.rng.uniform(0, 60 if index else 0), "submit", index)
        if config.faults:
            self._schedule_faults()

    def _schedule_faults(self) -> None:
        rng = self.rng
        for _ in range(rng.randint(2, 7)):
            when = EPOCH + rng.uniform(5, FAULT_WINDOW_S - 10)
            kind = rng.choice(("kill_agent", "pause_agent", "partition", "pause_worker", "kill_worker",
                               "redis_loss", "pause_agent", "partition", "kill_agent"))
            node = rng.choice(self.nodes)
            self.at(when, kind, node, round(rng.uniform(1, 110), 1))
        self.at(EPOCH + FAULT_WINDOW_S, "heal")

    def _loop(self) -> None:
        limit = EPOCH + FAULT_WINDOW_S + SETTLE_S
        while self._queue and not self.outcome.violations:
            when, _, what, args = heapq.heappop(self._queue)
            if when > limit:
                break
            self.clock.advance_to(when)
            for runner in self.runners.values():
                runner.advance(self.clock.now)
            getattr(self, f"_on_{what}")(*args)
            self.outcome.events += 1
            self._check(db=what == "worker")
            if what == "worker" and self.clock.now > EPOCH + FAULT_WINDOW_S and self._all_final():
                break
        self.outcome.ended_at = self.clock.now - EPOCH
        if not self.outcome.violations:
            self.outcome.violations.extend(invariants.not_final())
        self.outcome.final_states = {job.pk: job.state for job in self.jobs_now()}
        self.outcome.excused = sum(len(runs) - 1 for runs in self.completions.values())
        for violation in self.outcome.violations:
            self.trace(f"VIOLATION: {violation}")

    def _check(self, *, db: bool) -> None:
        found = invariants.completed_twice(self.completions, self.lost_at, self.exit_delivered_at,
                                            self.launch_delivered_at)
        found += invariants.gpus_held_twice([p for r in self.runners.values() for p in r.live_processes()])
        if db:
            found += invariants.exits_misreported(self.completions)
        self.outcome.violations.extend(found)

    def jobs_now(self):
        from jobs.models import Job

        return list(Job.objects.filter(pk__in=[job.pk for job in self.jobs]))

    def _all_final(self) -> bool:
        return len(self.jobs) == self.config.jobs and all(job.state in FINAL for job in self.jobs_now())

    # -- event handlers
    def _on_wake(self) -> None:
        pass

    def _on_submit(self, index: int) -> None:
        job = self.control_plane.submit(self._tenant, self._owner, f"sim-job-{index}")
        self.jobs.append(job)
        self.trace(f"job {job.pk} submitted")
        self._nudged = True

    def _on_agent_start(self, node: str) -> None:
        if self.agents[node] is None:
            client = AgentLink(fakeredis.FakeRedis(server=self.server), self, node)
            self.agents[node] = SimAgent(node, self.runners[node], client, self, self.config.gpus_per_node)
            self.trace(f"{node}: agent starts")
            self.at(self.clock.now, "agent", node, self.agents[node])

    def _on_agent(self, node: str, agent: SimAgent) -> None:
        if self.agents[node] is not agent:
            return  # (a killed agent's tick)
        if self.paused.get(node, 0.0) <= self.clock.now:
            agent.step()
        self.at(self.clock.now + AGENT_INTERVAL_S * self.rng.uniform(0.9, 1.1), "agent", node, agent)

    def _on_worker(self) -> None:
        if self.paused.get("worker", 0.0) <= self.clock.now:
            self._ticks += 1
            cycle, self._nudged = self._nudged or self._ticks % CYCLE_EVERY_TICKS == 0, False
            self.control_plane.tick(cycle=cycle)
        self.at(self.clock.now + WORKER_INTERVAL_S * self.rng.uniform(0.9, 1.1), "worker")

    def _on_deliver(self, stream, fields) -> None:
        command = protocol.decode_command(fields)
        if isinstance(command, protocol.LaunchJob):
            self.launch_delivered_at.setdefault(command.command_id, self.clock.now)
        self.redis.xadd(stream, fields, maxlen=protocol.STREAM_MAXLEN, approximate=True)

    def _on_kill_agent(self, node: str, down_s: float) -> None:
        if self.agents[node] is not None:
            self.trace(f"FAULT {node}: agent killed, back in {down_s}s")
            self.agents[node] = None
            self.at(self.clock.now + down_s, "agent_start", node)

    def _on_pause_agent(self, node: str, pause_s: float) -> None:
        self.trace(f"FAULT {node}: agent paused for {pause_s}s")
        self.paused[node] = max(self.paused.get(node, 0.0), self.clock.now + pause_s)

    def _on_partition(self, node: str, cut_s: float) -> None:
        self.trace(f"FAULT {node}: partitioned from Redis for {cut_s}s")
        self.partitions[node] = max(self.partitions.get(node, 0.0), self.clock.now + cut_s)

    def _on_pause_worker(self, node: str, pause_s: float) -> None:
        pause_s = min(pause_s, 60.0)
        self.trace(f"FAULT worker paused for {pause_s}s")
        self.paused["worker"] = max(self.paused.get("worker", 0.0), self.clock.now + pause_s)

    def _on_kill_worker(self, node: str, down_s: float) -> None:
        down_s = min(down_s, 30.0)
        self.trace(f"FAULT worker killed, a fresh one in {down_s}s")
        self.control_plane.restart()
        self.paused["worker"] = max(self.paused.get("worker", 0.0), self.clock.now + down_s)

    def _on_redis_loss(self, node: str, _s: float) -> None:
        self.trace("FAULT Redis lost: restarted empty")
        self.redis.flushall()

    def _on_heal(self) -> None:
        self.trace("faults stop; everything heals")
        self.faults_on = False
        self.paused.clear()
        self.partitions.clear()
        for node in self.nodes:
            if self.agents[node] is None:
                self.at(self.clock.now, "agent_start", node)


class _SeededUuid:
    """``uuid`` for :mod:`jobs.services.commands`: command ids drawn from the seed."""

    def __init__(self, rng: random.Random):
        self._rng = rng

    def uuid4(self):
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)


def run_seed(seed: int, config: Config | None = None, *, verbose: bool = False) -> Outcome:
    """Run one seed inside a transaction that is rolled back (the caller provides the database)."""
    from django.db import transaction

    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory(prefix="colony-sim-") as workdir:
        with transaction.atomic():
            outcome = World(seed, config, verbose=verbose, workdir=Path(workdir)).run(monkeypatch)
            transaction.set_rollback(True)
    return outcome
