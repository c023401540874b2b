"""The agent loop: Redis on one side, the job runner and GPU backend on the other.

Every interval it samples the GPUs (one ``NodeSample`` on the metrics stream), refreshes the
node's heartbeat, reads its command stream through a consumer group, applies each command
idempotently (launch, stop, duty cycle, suspend, resume), acks it, and reports job starts and
exits (including GPU out-of-memory kills) on the events stream. Redis going away never stops
jobs: events wait in a bounded outbox, and the last ``sample_buffer`` samples in a bounded ring;
after the agent reconnects and registers again it sends the events, then the samples, in order.
Nor does the agent itself going away: each job runs under its own supervisor process
(:mod:`agents.supervise`), and an agent that starts where another died adopts the jobs still
running and reports the ones that ended meanwhile (:meth:`agents.runner.JobRunner.recover`). A
clean shutdown (SIGTERM) still stops every job and reports it for a requeue.
Given its node key, it signs every message it writes (:mod:`agents.signing`); the control plane
rejects messages whose signature is not that of the node they name.
A launch starts only for the attempt the control plane holds now: commands are read in batches
(a paused agent's whole backlog), a launch that a later entry withdraws (its stop, a newer
attempt) is dropped, and one that waited in the stream past ``LAUNCH_LEASE_S`` waits for the
control plane's fresh re-send, which comes only while the attempt still stands.
Shared GPUs are fenced by the runner's isolation layer (:mod:`agents.isolation`): the agent reports
each GPU's mode when it registers, ends and requeues the jobs of a GPU whose MPS service failed
(their CUDA contexts went with it), and reports a job out of memory only from what it saw
(:mod:`agents.oom`), never from the job's output.
Each sample also drives the node's local coordinator (:mod:`agents.local_coordinator`): a borrower
on a GPU that saturates beside a guaranteed job is cut within a second or two, however slow or
silent the control plane, whose duty cycles are the borrowers' ceilings.

This module holds the loop, the connection and what is sent: the outbox, the sample buffer, the
heartbeat and the job exits. Commands are read and applied by :mod:`agents.command_intake`, live
output goes out through :mod:`agents.output_shipping`, recent exits are kept by
:mod:`agents.recent_exits`, and :mod:`agents.local_duty` moves borrowers from each sample.
What must not live here: process handling (:mod:`agents.runner`), GPU probing
(:mod:`agents.backends`), message shapes (:mod:`agents.protocol`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import socket
import threading
import time
from collections import deque

import pydantic

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agents import __version__, protocol, signing, streams
from agents.backends.base import GpuBackend
from agents.command_intake import COMMAND_MAX_AGE_S, COMMAND_MAX_SKEW_S, LAUNCH_LEASE_S, CommandIntake
from agents.host import HostOffer
from agents.local_coordinator import LocalCoordinator
from agents.local_duty import LocalDuty
from agents.notebooks import notebook_launches
from agents.oom import enforcing, observed_verdict
from agents.output_shipping import OutputShipper
from agents.recent_exits import RecentExits
from agents.runner import FinishedJob, JobRunner
from agents.sessions import SessionRelay, interactive_launches
from agents.tunnel import TunnelRelay

# COMMAND_MAX_AGE_S lives with the command checks; the command line takes its default from here.
__all__ = ["Agent", "COMMAND_MAX_AGE_S", "CredentialsRefused"]

log = logging.getLogger(__name__)


class CredentialsRefused(Exception):
    """Redis refused this node's login or its ACL rights: a configuration error that retrying
    cannot mend (unlike a connection error), so the agent ends and says why."""


OUTBOX_SIZE = 10_000
# Samples kept while Redis is away: five minutes at the default interval. Older ones are dropped
# (the ingest sees a gap in ``seq``); events are never traded for samples.
SAMPLE_BUFFER = 300
SAMPLE_BATCH = 100  # samples per pipelined round trip when catching up
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 5.0


class Agent:
    """One node's agent. ``run(stop)`` until ``stop`` is set; ``step()`` is one iteration."""

    def __init__(
        self,
        node: str,
        backend: GpuBackend,
        redis_url: str,
        runner: JobRunner,
        interval: float = 1.0,
        heartbeat_ttl: float = 10.0,
        *,
        shutdown_grace: float = 5.0,
        outbox_size: int = OUTBOX_SIZE,
        sample_buffer: int = SAMPLE_BUFFER,
        key: bytes | None = None,
        command_max_age: float = COMMAND_MAX_AGE_S,
        command_max_skew: float = COMMAND_MAX_SKEW_S,
        host: HostOffer | None = None,
        coordinator: LocalCoordinator | None = None,
        launch_lease: float = LAUNCH_LEASE_S,
        job_fences: tuple[str, ...] | None = None,
    ):
        """``job_fences``: what fences every job here (:data:`agents.protocol.JOB_FENCES`), as the
        command line found it at start; None: only ``accounts``, when jobs run as their researchers."""
        if not protocol.NODE_NAME_RE.match(node):
            raise ValueError(f"invalid node name {node!r}")
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.node = node
        self.backend = backend
        self.redis_url = redis_url
        self.runner = runner
        if getattr(runner, "node", None) is None:
            runner.node = node
        self.interval = interval
        self.heartbeat_ttl = heartbeat_ttl
        self.shutdown_grace = shutdown_grace
        self.hostname = socket.gethostname()[:255]
        self.host = host  # CPU and host memory offered to jobs; None: not reported
        # This node's key: signs what it writes and authenticates the commands it reads. None
        # (authentication off) sends unsigned messages and takes unsigned commands.
        self._key = key
        if command_max_age <= 0 or command_max_skew < 0:
            raise ValueError("command_max_age must be positive and command_max_skew not negative")
        if launch_lease <= 0:
            raise ValueError("launch_lease must be positive")
        if job_fences is None:
            job_fences = ("accounts",) if runner.run_as.maps_users else ()
        self.job_fences = tuple(fence for fence in protocol.JOB_FENCES if fence in set(job_fences))

        self._redis: redis.Redis | None = None
        self._stop = threading.Event()
        self._outbox: deque = deque()
        self._recent_exits = RecentExits(runner.workdir, node)
        self._outbox_size = outbox_size
        self.dropped_events = 0
        self._samples: deque[tuple[int, dict]] = deque()  # (seq, stream fields), oldest first
        self._sample_buffer = max(1, sample_buffer)
        self._seq = 0
        self._next_sample = 0.0
        self.dropped_samples = 0
        self._sample_failures: set[str] = set()
        self._next_heartbeat = 0.0
        self._next_connect = 0.0
        self._backoff = BACKOFF_FIRST
        self._disconnected_since: float | None = None
        self._output = OutputShipper(node, key)
        # Interactive sessions' keystrokes and output, on a thread of their own so they echo fast.
        self.sessions = SessionRelay(node, redis_url, key, runner.job_dir)
        # Notebook jobs' servers, reached from the control plane's proxy through Redis.
        self.tunnel = TunnelRelay(node, redis_url, key, runner.job_dir)
        self._next_output = 0.0
        # job id -> GPU index -> the most GPU memory a sample saw it hold (for memory-pressure exits).
        self._peak_mib: dict[int, dict[int, int]] = {}
        self._sharing_faults: set[int] = set()  # jobs being stopped because their MPS GPU failed
        # Moves borrowers between their floor and the control plane's ceiling from each sample.
        self.coordinator = coordinator or LocalCoordinator()
        self._local_duty = LocalDuty(runner, self.coordinator)
        self.commands = CommandIntake(
            node, runner, publish=self._publish, exit_report=self._exited, recent_exits=self._recent_exits,
            local_duty=self._local_duty, key=key, max_age=command_max_age, max_skew=command_max_skew,
            launch_lease=launch_lease, grace=shutdown_grace,
        )

    @property
    def connected(self) -> bool:
        return self._redis is not None

    @property
    def buffered_events(self) -> int:
        """Events waiting to be sent (grows while Redis is unreachable)."""
        return len(self._outbox)

    @property
    def buffered_samples(self) -> list[int]:
        """The ``seq`` of each sample waiting to be sent, oldest first."""
        return [seq for seq, _fields in list(self._samples)]  # list(): one step, safe from other threads

    @property
    def stale_launches(self) -> int:
        """Launches not started because they waited past the lease, or were withdrawn."""
        return self.commands.stale_launches

    @property
    def launch_lease(self) -> float:
        return self.commands.launch_lease

    @property
    def local_duty_changes(self) -> int:
        """How many times the local coordinator moved a borrower's duty cycle."""
        return self._local_duty.changes

    @property
    def shipped_output_bytes(self) -> int:
        return self._output.shipped_bytes

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set, then stop every job and report their exits."""
        self._stop = stop
        log.info("agent %s starting (backend %s, interval %.2fs)", self.node, self.backend.name, self.interval)
        # Before registering, take over what an earlier agent left: jobs still running under their
        # supervisors are adopted (registered as running, reported when they end); jobs that ended
        # meanwhile are reported from their supervisor's record; processes nobody supervises are
        # stopped, so they never run beside the job's next attempt. Exits wait in the outbox,
        # sent once registered.
        self._load_recent_exits()
        for finished in self.runner.recover(self.shutdown_grace):
            self._publish(self._exited(finished))
        self.commands.remember_launches(self.runner.last_launches())
        self.sessions.start()
        self.tunnel.start()
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.shutdown()

    def step(self) -> None:
        """One iteration: reconnect if due, reap exits, sample, heartbeat, read and apply commands."""
        if self._redis is None and time.monotonic() >= self._next_connect:
            self._connect()
        self._report_exits()
        self.sessions.track(interactive_launches(self.runner))
        self.tunnel.track(notebook_launches(self.runner))
        self._requeue_mps_faults()
        if time.monotonic() >= self._next_sample:
            self._take_sample()
        if self._redis is None:
            # Offline: keep reaping jobs and sampling while waiting for the next attempt.
            now = time.monotonic()
            self._stop.wait(max(0.0, min(self.interval, self._next_connect - now, self._next_sample - now)))
            return
        try:
            self._flush()
            if time.monotonic() >= self._next_heartbeat:
                self._heartbeat()
            # Back in time for the next sample (which is also when the heartbeat is due).
            block_s = min(self.interval, self._next_sample - time.monotonic())
            self.commands.read(self._redis, block_ms=max(1, int(block_s * 1000)))
            self._flush()
            if time.monotonic() >= self._next_output:
                self._ship_output()
        except redis.RedisError as exc:
            self._lost(exc)

    def shutdown(self) -> None:
        """Stop all jobs (SIGTERM, SIGKILL after the grace), publish their exits best-effort.
        An exit Redis did not take stays in its job's records, for the next agent to report."""
        if self.runner.running():
            log.info("stopping %d running job(s)", len(self.runner.running()))
        self._report_exits()  # jobs that ended by themselves are reported as they ended
        for finished in self.runner.stop_all(self.shutdown_grace, requeue=True):
            # Jobs the agent stops because it is going away are not done: the control plane
            # requeues them (a job being cancelled or preempted is settled as that anyway). One
            # that finished or ran out of memory just before the stop reached it is reported as it was.
            ended_by_stop = finished.exit_code != 0 and not finished.oom and not finished.timed_out
            self._publish(self._exited(dataclasses.replace(finished, requeue=ended_by_stop)))
        self.sessions.track({})  # their last output goes out as the relay stops
        self.sessions.close()
        self.tunnel.track({})
        self.tunnel.close()
        self.runner.close()
        self.runner.isolation.close()  # the MPS daemons stop once no job of ours uses them
        if self._redis is None and self._outbox:
            try:
                self._connect(register=False)
            except CredentialsRefused:
                pass  # the exits stay in their jobs' records, as when Redis is away
        if self._redis is not None:
            try:
                self._flush()
            except redis.RedisError as exc:
                log.warning(
                    "could not send %d event(s) and %d sample(s) on shutdown: %s",
                    len(self._outbox),
                    len(self._samples),
                    exc,
                )
            self._redis.close()
            self._redis = None
        elif self._outbox:
            log.warning("Redis unreachable; %d event(s) not sent on shutdown", len(self._outbox))
        # Exits Redis did not take keep their records, for the next agent to report.
        self.runner.release_reported(
            {(m.job_id, m.launch_id) for m in list(self._outbox) if isinstance(m, protocol.JobExited)}
        )
        log.info("agent %s stopped", self.node)

    # ------------------------------------------------------------------ connection

    def _connect(self, register: bool = True) -> None:
        client = redis.Redis.from_url(
            self.redis_url,
            socket_connect_timeout=2.0,
            # Must outlast the XREADGROUP block; a hung server is noticed a few seconds later.
            socket_timeout=self.interval + 5.0,
            # Our loop does the backoff; the client's own retries would stall the job reaping.
            retry=Retry(NoBackoff(), 0),
            protocol=2,  # the reply shapes _entries() expects
        )
        try:
            client.ping()
            self._redis = client
            if register:
                self._register()
                self._ensure_group()
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
            # (AuthenticationError is a ConnectionError: caught before the transient kind.)
            self._redis = None
            client.close()
            raise CredentialsRefused(f"Redis refused node {self.node}'s credentials: {exc}") from None
        except redis.RedisError as exc:
            self._redis = None
            client.close()
            self._schedule_reconnect(exc)
            return
        if self._disconnected_since is not None:
            again = self._recent_exits.to_send_again(self._outbox)
            self._outbox.extendleft(reversed(again))  # they went before anything still buffered
            log.info(
                "reconnected to Redis after %.1fs; sending %d buffered event(s) (%d of them exits sent "
                "before, in case Redis lost them) and %d sample(s)",
                time.monotonic() - self._disconnected_since,
                len(self._outbox),
                len(again),
                len(self._samples),
            )
        else:
            log.info("connected to Redis")
        self._disconnected_since = None
        self._backoff = BACKOFF_FIRST
        self.commands.read_pending = True  # entries delivered before the outage but never acked
        self._next_heartbeat = 0.0

    def _lost(self, exc: Exception) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        self._schedule_reconnect(exc)

    def _schedule_reconnect(self, exc: Exception) -> None:
        if self._disconnected_since is None:
            # Log once per outage; jobs keep running and events are buffered meanwhile.
            log.warning("Redis unavailable (%s); jobs keep running, events are buffered", exc)
            self._disconnected_since = time.monotonic()
        else:
            log.debug("reconnect failed: %s", exc)
        self._next_connect = time.monotonic() + self._backoff
        self._backoff = min(BACKOFF_MAX, self._backoff * 2)

    def _register(self) -> None:
        gpus = self.runner.isolation.annotate(self.backend.inventory())
        self.commands.gpu_indices = {gpu.index for gpu in gpus}
        try:
            topology = self.backend.topology()
        except Exception:  # a backend bug must not keep the node from registering
            log.exception("could not read the GPU topology; registering without it")
            topology = []
        message = protocol.NodeRegistered(
            node=self.node,
            gpus=gpus,
            topology=topology,
            backend=self.backend.name,
            agent_version=__version__,
            hostname=self.hostname,
            running_jobs=sorted(self.runner.running()),
            runtimes=[runtime.name] if (runtime := getattr(self.runner, "container_runtime", None)) else [],
            cpu_milli=self.host.cpu_milli if self.host else None,
            host_memory_mib=self.host.host_memory_mib if self.host else None,
            job_fences=list(self.job_fences),
        )
        fields = protocol.encode(message)
        if len(fields["m"]) > protocol.MAX_MESSAGE_BYTES:
            # Only a node with dozens of GPUs gets here (every pair is a link); the GPUs matter more.
            log.warning("registration with %d topology links is too large; sending it without them", len(topology))
            fields = protocol.encode(message.model_copy(update={"topology": []}))
        self._xadd(protocol.node_events_stream(self.node), signing.signed(fields, self._key))
        log.info("registered with %d GPU(s), %d running job(s)", len(gpus), len(message.running_jobs))

    def _ensure_group(self) -> None:
        streams.ensure_group(self._redis, self.commands.stream, protocol.AGENT_COMMAND_GROUP)

    def _xadd(self, stream: str, fields: dict) -> None:
        self._redis.xadd(stream, fields, maxlen=protocol.STREAM_MAXLEN, approximate=True)

    # ------------------------------------------------------------------ outgoing

    def _publish(self, message) -> None:
        """Queue an event; :meth:`_flush` sends the queue in order while connected."""
        if len(self._outbox) >= self._outbox_size:
            self._outbox.popleft()
            self.dropped_events += 1
            if self.dropped_events == 1 or self.dropped_events % 1000 == 0:
                log.warning("event buffer full; %d oldest event(s) dropped so far", self.dropped_events)
        self._outbox.append(message)
        if isinstance(message, protocol.JobExited):
            self._recent_exits.add(message)

    def _load_recent_exits(self) -> None:
        self._recent_exits.load()

    def _recent_exit(self, job_id: int, launch_id: str | None) -> protocol.JobExited | None:
        return self._recent_exits.find(job_id, launch_id)

    def _flush(self) -> None:
        """Send buffered events, then buffered samples, oldest first; each leaves its buffer only
        once Redis has it (so an outage mid-flush may repeat a sample, never lose one)."""
        while self._outbox and self._redis is not None:
            self._xadd(protocol.node_events_stream(self.node),
                       signing.signed(protocol.encode(self._outbox[0]), self._key))
            self._outbox.popleft()
        while self._samples and self._redis is not None:
            batch = list(itertools.islice(self._samples, SAMPLE_BATCH))
            pipe = self._redis.pipeline(transaction=False)
            for _seq, fields in batch:
                pipe.xadd(protocol.node_metrics_stream(self.node), fields, maxlen=protocol.STREAM_MAXLEN,
                          approximate=True)
            pipe.execute()
            for _ in batch:
                self._samples.popleft()

    def _take_sample(self) -> None:
        """Read the GPUs, kill jobs that ran out of GPU memory, and buffer one NodeSample."""
        now = time.monotonic()
        self._next_sample += self.interval
        if self._next_sample <= now:  # first sample, or we fell behind: no burst to catch up
            self._next_sample = now + self.interval
        try:
            reading = self.runner.isolation.readable(self.backend.sample(self.runner.processes()))
        except Exception as exc:  # a backend bug costs this sample, never the node's jobs
            self._sample_failed("the GPU backend failed", exc)
            return
        for oom in reading.out_of_memory:
            self.runner.kill_out_of_memory(oom.job_id, oom.error)
        try:
            self._local_duty.after_reading(reading.gpus)
        except Exception as exc:  # a coordinator bug leaves duty cycles to the control plane, never ends the sample
            self._sample_failed("the local coordinator failed", exc)
        for usage in reading.jobs:
            peaks = self._peak_mib.setdefault(usage.job_id, {})
            peaks[usage.gpu_index] = max(peaks.get(usage.gpu_index, 0), usage.mem_used_mib)
        try:
            running = sorted(self.runner.running())
            sample = protocol.NodeSample(
                node=self.node,
                ts=time.time(),
                seq=self._seq,
                gpus=reading.gpus,
                jobs=reading.jobs,
                unattributed_mib=reading.unattributed_mib,
                running_jobs=running,
                running_launches=sorted(self.runner.running_launches().values()),
                duty_cycles=[min(1.0, max(0.0, self.runner.duty_cycle(job_id))) for job_id in running],
            )
            fields = protocol.encode(sample)
            if len(fields["m"]) > protocol.MAX_MESSAGE_BYTES:
                self._sample_failed("sample too large; per-job figures left out", None)
                fields = protocol.encode(sample.model_copy(update={"jobs": []}))
            fields = signing.signed(fields, self._key)
        except pydantic.ValidationError as exc:
            self._sample_failed("the GPU backend returned an invalid reading", exc)
            return
        if len(self._samples) >= self._sample_buffer:
            self._samples.popleft()
            self.dropped_samples += 1
            if self.dropped_samples == 1 or self.dropped_samples % 100 == 0:
                log.warning("sample buffer full; %d oldest sample(s) dropped so far", self.dropped_samples)
        self._samples.append((self._seq, fields))
        self._seq += 1

    def _sample_failed(self, what: str, exc: Exception | None) -> None:
        key = f"{what}: {exc!r}"[:300]
        if key in self._sample_failures:
            return
        if len(self._sample_failures) < 1000:
            self._sample_failures.add(key)
        log.error("sample: %s%s (logged once)", what, f": {exc!r}" if exc is not None else "", exc_info=exc)

    def _ship_output(self) -> None:
        now = time.monotonic()
        self._next_output = now + self.interval
        self._output.ship(self._redis, self.runner.running_launches(), self.runner.job_dir, now)

    def _heartbeat(self) -> None:
        value = json.dumps({"ts": time.time(), "running": sorted(self.runner.running())})
        self._redis.set(protocol.heartbeat_key(self.node), value, ex=max(1, math.ceil(self.heartbeat_ttl)))
        self._next_heartbeat = time.monotonic() + self.interval

    def _report_exits(self) -> None:
        for finished in self.runner.poll():
            self._publish(self._exited(finished))
        # A job's exit record (its supervisor's exit.json) stays on disk until Redis has the
        # event: an agent killed before then leaves it for the next agent to report again.
        self.runner.release_reported(
            {(m.job_id, m.launch_id) for m in list(self._outbox) if isinstance(m, protocol.JobExited)}
        )

    def _requeue_mps_faults(self) -> None:
        """A GPU whose MPS daemon or server failed took its clients' CUDA contexts with it: end
        them (stop signal, then SIGKILL after the shutdown grace) and report them for a requeue."""
        for fault in self.runner.isolation.mps_faults():
            for job_id in fault.job_ids:
                self._sharing_faults.add(job_id)
                self.runner.stop(job_id, self.shutdown_grace, requeue=True,
                                 error=f"{fault.reason}; the job was stopped to run again")

    def _exited(self, finished: FinishedJob) -> protocol.JobExited:
        peaks = self._peak_mib.pop(finished.job_id, {})
        if not finished.oom and not finished.stopped and not finished.requeue and finished.error is None:
            # The verdict comes from what this node saw, never from what the job printed.
            layer = self.runner.isolation
            modes = {} if layer.native else {i: layer.mode(i) for i in finished.gpu_indices}
            oom, error = observed_verdict(finished.job_id, finished.exit_code, finished.gpu_memory_limit_mib,
                                          enforcing(modes, finished.gpu_indices), peaks, finished.output_tail)
            if error is not None:
                finished = dataclasses.replace(finished, oom=oom, error=error)
        sharing_fault = finished.job_id in self._sharing_faults
        self._sharing_faults.discard(finished.job_id)
        return protocol.JobExited(
            node=self.node,
            job_id=finished.job_id,
            exit_code=finished.exit_code,
            stopped=finished.stopped,
            oom=finished.oom,
            timed_out=finished.timed_out,
            requeue=finished.requeue,
            requeue_cause="gpu_sharing_fault" if sharing_fault and finished.requeue else None,
            launch_id=finished.launch_id,
            error=finished.error[:2000] if finished.error else None,
            output_tail=finished.output_tail,
            finished_at=finished.finished_at,
        )
