"""A simulated node: the real agent command handling (:class:`agents.command_intake.CommandIntake`,
:mod:`agents.command_checks`, :class:`agents.recent_exits.RecentExits`) over a process table whose
jobs are simulated, driven by :mod:`tests.simulation.world` on the simulated clock.

:class:`SimRunner` plays the runner and its per-job supervisors: it outlives the agent (a killed
agent's jobs run on, and their exit records wait for the next agent, as ``agents.runner`` keeps them
on disk). Each job's run takes the job's own seeded duration and exits with the job's own code:
that is its *real exit*, which the invariants hold the control plane to. A stop ends a run after
a short seeded delay unless the run reaches its own end first.

:class:`SimAgent` is :class:`agents.agent.Agent`'s loop in small: connect and register, reap
exits, sample, heartbeat, read commands, flush the outbox (an exit stays there until Redis took it;
the recent ones are sent again after a reconnect). Every message goes unsigned: agent
authentication (signing) is off in the simulation, as it changes no decision of the protocol.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import deque
from pathlib import Path

import redis

from agents import protocol, streams
from agents.command_intake import COMMAND_MAX_AGE_S, COMMAND_MAX_SKEW_S, LAUNCH_LEASE_S, CommandIntake
from agents.job_processes import FinishedJob
from agents.recent_exits import RecentExits

log = logging.getLogger(__name__)

HEARTBEAT_TTL_S = 10
SAMPLE_EVERY_S = 2.0
GPU_MEMORY_MIB = 81920


@dataclasses.dataclass
class SimProcess:
    """One run of a job on a node (a launch's supervisor and the job's processes)."""

    node: str
    launch: protocol.LaunchJob
    pid: int
    started_at: float
    natural_end: float  # when the job's work is done
    natural_code: int  # the job's real exit code
    stop_at: float | None = None  # when a stop (or kill) takes effect
    requeue: bool = False
    ended_at: float | None = None
    exit_code: int | None = None
    ran_to_end: bool = False

    @property
    def job_id(self) -> int:
        return self.launch.job_id

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(self.launch.gpu_indices)


class SimRunner:
    """The node's process table: what ``agents.runner.JobRunner`` offers the agent and its
    command intake, on simulated processes. ``world`` decides durations and stop delays and is
    told of every start and end (its ground truth)."""

    def __init__(self, node: str, world, workdir: Path):
        self.node, self.world, self.workdir = node, world, workdir
        self._running: dict[int, SimProcess] = {}
        self._records: dict[tuple[int, str], FinishedJob] = {}  # exit records not yet released
        self._unpolled: list[FinishedJob] = []
        self._launch_records: dict[int, protocol.LaunchJob] = {}
        self._pids = iter(range(1000, 10**6))
        self.isolation = None

    # -- what the world drives
    def advance(self, now: float) -> None:
        """End the runs whose end (their own, or a stop's) is due by ``now``."""
        for job_id, process in list(self._running.items()):
            end = min(process.natural_end, process.stop_at if process.stop_at is not None else float("inf"))
            if end > now:
                continue
            process.ran_to_end = process.natural_end <= end
            process.ended_at = end
            process.exit_code = process.natural_code if process.ran_to_end else -15
            del self._running[job_id]
            finished = FinishedJob(job_id=job_id, exit_code=process.exit_code,
                                   stopped=process.stop_at is not None, output_tail="", finished_at=end,
                                   requeue=process.requeue and not process.ran_to_end,
                                   launch_id=process.launch.command_id, gpu_indices=process.gpu_indices)
            self._records[(job_id, process.launch.command_id)] = finished
            self._unpolled.append(finished)
            self.world.process_ended(process)

    def live_processes(self) -> list[SimProcess]:
        return list(self._running.values())

    # -- what the agent and CommandIntake call (agents.runner.JobRunner's names)
    def needs_code(self, command) -> bool:
        return False

    def launch(self, command: protocol.LaunchJob, code_archive=None) -> int:
        now = self.world.clock.now
        duration, code = self.world.job_work(command.job_id)
        process = SimProcess(node=self.node, launch=command, pid=next(self._pids), started_at=now,
                             natural_end=now + duration, natural_code=code)
        self._running[command.job_id] = process
        self._launch_records[command.job_id] = command
        self.world.process_started(process)
        return process.pid

    def stop(self, job_id: int, grace_seconds: float, *, requeue: bool = False, preempt: bool = False,
             error: str | None = None) -> bool:
        process = self._running.get(job_id)
        if process is None:
            return False
        if process.stop_at is None:
            process.stop_at = self.world.clock.now + self.world.stop_delay(grace_seconds)
            process.requeue = requeue
            self.world.wake_at(process.stop_at)
        return True

    def suspend(self, job_id: int) -> bool:
        return job_id in self._running

    def resume(self, job_id: int) -> bool:
        return job_id in self._running

    def duty_cycle(self, job_id: int) -> float:
        return 1.0

    def running(self) -> set[int]:
        return set(self._running)

    def running_launches(self) -> dict[int, str]:
        return {job_id: p.launch.command_id for job_id, p in self._running.items()}

    def launch_of(self, job_id: int):
        process = self._running.get(job_id)
        return None if process is None else process.launch

    def processes(self) -> dict:
        return dict(self._running)

    def last_launches(self) -> list[protocol.LaunchJob]:
        return list(self._launch_records.values())

    def never_started(self, command) -> bool:
        return False  # (a launch here starts its run at once: no half-taken state to find)

    def adopt_late(self, job_id, launch_id, grace_seconds) -> list:
        return []

    def poll(self) -> list[FinishedJob]:
        polled, self._unpolled = self._unpolled, []
        return polled

    def recover(self, grace_seconds: float) -> list[FinishedJob]:
        """A new agent: the exits of runs that ended unreported (their records are still there)."""
        self._unpolled = []
        return sorted(self._records.values(), key=lambda f: f.finished_at)

    def release_reported(self, pending: set) -> None:
        polled = set(self._records) - {(f.job_id, f.launch_id) for f in self._unpolled}
        for key in polled - pending:
            del self._records[key]


class _LocalDuty:
    """The local coordinator is not simulated: duty cycles change no outcome here."""

    def started(self, job_id: int) -> None:
        pass

    def set_by_control_plane(self, command) -> bool:
        return True


class SimAgent:
    """One agent process on ``node`` (a kill drops it; a restart makes a new one on the same runner)."""

    def __init__(self, node: str, runner: SimRunner, client, world, gpu_count: int):
        self.node, self.runner, self.client, self.world = node, runner, client, world
        self.gpu_count = gpu_count
        self.outbox: deque = deque()
        self.recent_exits = RecentExits(runner.workdir, node)
        self.intake = CommandIntake(node, runner, publish=self._publish, exit_report=self._exited,
                                    recent_exits=self.recent_exits, local_duty=_LocalDuty(), key=None,
                                    max_age=COMMAND_MAX_AGE_S, max_skew=COMMAND_MAX_SKEW_S,
                                    launch_lease=LAUNCH_LEASE_S, grace=5.0)
        self.connected = False
        self.ever_connected = False
        self.seq = 0
        self.next_sample = 0.0
        # As Agent.run: take over what an earlier agent left before anything else.
        self.recent_exits.load()
        for finished in runner.recover(5.0):
            self._publish(self._exited(finished))
        self.intake.remember_launches(runner.last_launches())

    def step(self) -> None:
        try:
            if not self.connected:
                self._connect()
            self._report_exits()
            now = self.world.clock.now
            if now >= self.next_sample:
                self.next_sample = now + SAMPLE_EVERY_S
                self._sample()
            self._flush()
            self.client.set(protocol.heartbeat_key(self.node), json.dumps({"ts": now}), ex=HEARTBEAT_TTL_S)
            self.intake.read(self.client, block_ms=1)
            self._flush()
        except redis.RedisError as exc:
            self.world.trace(f"{self.node} agent: redis error {type(exc).__name__}; reconnecting")
            self.connected = False

    def _connect(self) -> None:
        self.client.ping()
        gpus = [protocol.GpuInfo(index=i, uuid=f"GPU-{self.node}-{i}", model="A100-80GB", memory_mib=GPU_MEMORY_MIB)
                for i in range(self.gpu_count)]
        self.intake.gpu_indices = set(range(self.gpu_count))
        register = protocol.NodeRegistered(node=self.node, gpus=gpus, backend="simulated", agent_version="sim",
                                           hostname=self.node, running_jobs=sorted(self.runner.running()))
        self.client.xadd(protocol.node_events_stream(self.node), protocol.encode(register))
        streams.ensure_group(self.client, self.intake.stream, protocol.AGENT_COMMAND_GROUP)
        if self.ever_connected:
            again = self.recent_exits.to_send_again(self.outbox)
            self.outbox.extendleft(reversed(again))
        self.connected = self.ever_connected = True
        self.intake.read_pending = True

    def _publish(self, message) -> None:
        self.outbox.append(message)
        if isinstance(message, protocol.JobExited):
            self.recent_exits.add(message)

    def _flush(self) -> None:
        while self.outbox:
            self.client.xadd(protocol.node_events_stream(self.node), protocol.encode(self.outbox[0]))
            sent = self.outbox.popleft()
            if isinstance(sent, protocol.JobExited):
                self.world.exit_delivered(sent)

    def _report_exits(self) -> None:
        for finished in self.runner.poll():
            self._publish(self._exited(finished))
        self.runner.release_reported({(m.job_id, m.launch_id) for m in self.outbox
                                      if isinstance(m, protocol.JobExited)})

    def _sample(self) -> None:
        running = sorted(self.runner.running())
        busy = {i for p in self.runner.live_processes() for i in p.gpu_indices}
        sample = protocol.NodeSample(
            node=self.node, ts=self.world.clock.now, seq=self.seq,
            gpus=[protocol.GpuSample(index=i, util_sm=90.0 if i in busy else 0.0, mem_used_mib=1024 if i in busy else 0,
                                     mem_total_mib=GPU_MEMORY_MIB) for i in range(self.gpu_count)],
            running_jobs=running, running_launches=sorted(self.runner.running_launches().values()),
            duty_cycles=[1.0 for _ in running])
        self.seq += 1
        self.client.xadd(protocol.node_metrics_stream(self.node), protocol.encode(sample))

    def _exited(self, finished: FinishedJob) -> protocol.JobExited:
        return protocol.JobExited(node=self.node, job_id=finished.job_id, exit_code=finished.exit_code,
                                  stopped=finished.stopped, requeue=finished.requeue, launch_id=finished.launch_id,
                                  output_tail="", finished_at=finished.finished_at)
