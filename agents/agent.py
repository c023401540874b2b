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

What must not live here: process handling (:mod:`agents.runner`), GPU probing
(:mod:`agents.backends`), message shapes (:mod:`agents.protocol`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import socket
import threading
import time
from collections import OrderedDict, deque

import pydantic

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agents import __version__, code, protocol, signing, streams
from agents.backends.base import GpuBackend
from agents.host import HostOffer
from agents.local_coordinator import LocalCoordinator, Resident
from agents.oom import enforcing, observed_verdict
from agents.runner import FinishedJob, JobRunner, LaunchError, read_output

log = logging.getLogger(__name__)


class CredentialsRefused(Exception):
    """Redis refused this node's login or its ACL rights: a configuration error that retrying
    cannot mend (unlike a connection error), so the agent ends and says why."""


READ_COUNT = 32
# Entries read (in READ_COUNT pages) before any is applied: a launch is weighed against what
# follows it in its stream (see ``_withdrawn_launches``), e.g. a paused agent's whole backlog.
READ_BACKLOG = 1024
# A launch starts only for the attempt the control plane holds now. One that waited in the stream
# longer than this (its agent paused, or starved on a loaded machine) may have been requeued
# since: it is not started, and the control plane's re-send, issued afresh every
# COLONY_RESEND_AFTER_S (15 s) while the job is still placed, confirms the attempt and runs.
# Timed on Redis's clock (entry id against TIME), so the node's clock plays no part.
LAUNCH_LEASE_S = 10.0
OUTBOX_SIZE = 10_000
# Samples kept while Redis is away: five minutes at the default interval. Older ones are dropped
# (the ingest sees a gap in ``seq``); events are never traded for samples.
SAMPLE_BUFFER = 300
# Exits sent in the last RECENT_EXITS_S seconds are sent again after a reconnect: Redis keeps
# nothing on disk, so an exit it took just before it restarted may be gone unread. The control
# plane ignores an exit it already applied.
RECENT_EXITS = 256
RECENT_EXITS_S = 600.0
# They are also kept on disk (one JSON line each, in the work directory), so that an agent started
# after a crash still knows how the attempts it took over ended: a re-sent launch, a stop or a
# query about one is answered with its real exit instead of silence (a job stuck PLACED) or
# "absent" (a finished job run again).
RECENT_EXITS_FILE = "recent-exits.jsonl"
# A launch delivered again this soon after this agent applied it is a duplicate delivery, whose
# reports are still on their way: it changes nothing and says nothing. Later (the control plane
# re-sends after 15 s without a start) it is answered with how the attempt stands.
REANSWER_AFTER_S = 5.0
SAMPLE_BATCH = 100  # samples per pipelined round trip when catching up
# How many applied command ids are remembered for idempotency. Commands are
# re-delivered only shortly after they were sent (pending entries, duplicates), so this is plenty.
MEMORY_SIZE = 10_000
# A signed command older than this is refused (a captured one cannot be replayed later); one
# issued further than COMMAND_MAX_SKEW_S ahead of this node's clock too. The control plane re-sends
# what is still wanted (launches of placed jobs, stops), freshly issued.
COMMAND_MAX_AGE_S = 300.0
COMMAND_MAX_SKEW_S = 30.0
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 5.0
# Live output: each interval, at most OUTPUT_CHUNK_BYTES of each running job's output.log and
# OUTPUT_NODE_BYTES for the whole node go to the node's logs stream, so output never crowds out
# events or samples. A job more than OUTPUT_LAG_BYTES ahead of what was shipped is skipped to its
# newest output (a live tail, not a transfer); the whole log stays on the node.
OUTPUT_CHUNK_BYTES = protocol.OUTPUT_CHUNK_BYTES
OUTPUT_NODE_BYTES = 8 * OUTPUT_CHUNK_BYTES
OUTPUT_LAG_BYTES = 4 * OUTPUT_CHUNK_BYTES
# Chunks per interval for the whole node (with more running jobs, they take turns): about what
# the control plane's fan-in moves a node per round.
OUTPUT_NODE_CHUNKS = 32
# The node's logs stream holds at most about this many chunks while the control plane is not
# draining it (about 8 MiB).
OUTPUT_STREAM_MAXLEN = 1000


class _BoundedSet:
    """A set that forgets its oldest members beyond ``size``."""

    def __init__(self, size: int):
        self._items: OrderedDict = OrderedDict()
        self._size = size

    def add(self, item) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __contains__(self, item) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)


@dataclasses.dataclass
class _OutputCursor:
    """How far a job's output.log has been shipped (see :func:`agents.runner.read_output`)."""

    launch_id: str | None
    offset: int = 0
    anchor: bytes = b""
    shipped_at: float = 0.0  # monotonic; the longest-waiting job goes first when the node's budget is short
    ended: bool = False  # the job is gone: its last output was read once, then the cursor goes


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
        self.stream = protocol.command_stream(node)
        # This node's key: signs what it writes and authenticates the commands it reads. None
        # (authentication off) sends unsigned messages and takes unsigned commands.
        self._key = key
        if command_max_age <= 0 or command_max_skew < 0:
            raise ValueError("command_max_age must be positive and command_max_skew not negative")
        self.command_max_age = command_max_age
        self.command_max_skew = command_max_skew
        if launch_lease <= 0:
            raise ValueError("launch_lease must be positive")
        self.launch_lease = launch_lease
        if job_fences is None:
            job_fences = ("accounts",) if runner.run_as.maps_users else ()
        self.job_fences = tuple(fence for fence in protocol.JOB_FENCES if fence in set(job_fences))
        self.stale_launches = 0  # launches not started because they waited past the lease, or were withdrawn

        self._redis: redis.Redis | None = None
        self._stop = threading.Event()
        self._outbox: deque = deque()
        self._recent_exits: deque[tuple[float, protocol.JobExited]] = deque(maxlen=RECENT_EXITS)
        self._kept_exits = 0  # lines in RECENT_EXITS_FILE
        self._launched_at: OrderedDict[str, float] = OrderedDict()  # launch command id -> when applied here
        self._outbox_size = outbox_size
        self.dropped_events = 0
        self._samples: deque[tuple[int, dict]] = deque()  # (seq, stream fields), oldest first
        self._sample_buffer = max(1, sample_buffer)
        self._seq = 0
        self._next_sample = 0.0
        self.dropped_samples = 0
        self._sample_failures: set[str] = set()
        self._applied_commands = _BoundedSet(MEMORY_SIZE)
        # job id -> the newest launch attempt seen for it (least recently launched forgotten first).
        self._launch_attempts: OrderedDict[int, int] = OrderedDict()
        self._gpu_indices: set[int] = set()
        self._read_pending = True
        self._next_heartbeat = 0.0
        self._next_connect = 0.0
        self._backoff = BACKOFF_FIRST
        self._disconnected_since: float | None = None
        self._output: dict[int, _OutputCursor] = {}  # job id -> how far its output was shipped
        self._next_output = 0.0
        self.shipped_output_bytes = 0
        # job id -> GPU index -> the most GPU memory a sample saw it hold (for memory-pressure exits).
        self._peak_mib: dict[int, dict[int, int]] = {}
        self._sharing_faults: set[int] = set()  # jobs being stopped because their MPS GPU failed
        # Moves borrowers between their floor and the control plane's ceiling from each sample.
        self.coordinator = coordinator or LocalCoordinator()
        self.local_duty_changes = 0  # how many times it moved one

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
        self._remember_launches(self.runner.last_launches())
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
            self._read_commands()
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
            now = time.monotonic()
            again = [m for t, m in self._recent_exits if now - t < RECENT_EXITS_S and m not in self._outbox]
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
        self._read_pending = True  # entries delivered before the outage but never acked
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
        self._gpu_indices = {gpu.index for gpu in gpus}
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
        streams.ensure_group(self._redis, self.stream, protocol.AGENT_COMMAND_GROUP)

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
            self._recent_exits.append((time.monotonic(), message))
            if not message.absent:
                self._keep_exit(message)

    def _keep_exit(self, message: protocol.JobExited) -> None:
        path = self.runner.workdir / RECENT_EXITS_FILE
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8", opener=_private) as file:
                file.write(_exit_line(time.time(), message))
            self._kept_exits += 1
            if self._kept_exits > 2 * RECENT_EXITS:
                self._save_recent_exits()
        except OSError as exc:
            log.warning("could not keep job %d's exit on disk (%s); it is kept in memory only", message.job_id, exc)

    def _save_recent_exits(self) -> None:
        """Rewrite the file with the exits still remembered (it would otherwise grow for ever)."""
        path = self.runner.workdir / RECENT_EXITS_FILE
        now, wall = time.monotonic(), time.time()
        lines = [_exit_line(wall - (now - sent_at), message) for sent_at, message in self._recent_exits
                 if not message.absent]
        partial = path.with_suffix(".tmp")
        with open(partial, "w", encoding="utf-8", opener=_private) as file:
            file.writelines(lines)
        partial.replace(path)
        self._kept_exits = len(lines)

    def _load_recent_exits(self) -> None:
        """The exits an earlier agent on this node sent in the last RECENT_EXITS_S seconds."""
        path = self.runner.workdir / RECENT_EXITS_FILE
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s: unreadable (%s); earlier exits are not remembered", path, exc)
            return
        now, wall = time.monotonic(), time.time()
        for line in lines[-RECENT_EXITS:]:
            try:
                kept = json.loads(line)
                at, message = float(kept["at"]), protocol.JobExited.model_validate(kept["exit"])
            except (ValueError, TypeError, KeyError, pydantic.ValidationError):
                continue  # (a line cut short by a crash)
            if 0 <= wall - at < RECENT_EXITS_S and message.node == self.node:
                self._recent_exits.append((now - (wall - at), message))
        try:
            self._save_recent_exits()
        except OSError as exc:
            log.warning("%s: not rewritten (%s)", path, exc)

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
            self._coordinate(reading.gpus)
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

    def _coordinate(self, gpus: list[protocol.GpuSample]) -> None:
        """Let the local coordinator move borrowers from this reading, and apply its moves (the
        sample being built reports them: its ``duty_cycles`` are what each job runs at now)."""
        running = self.runner.running()
        for job_id in self.coordinator.known() - running:
            self.coordinator.forget(job_id)
        for job_id in running:
            self._coordinated(job_id)
        utilisation = {gpu.index: None if gpu.util_sm is None else gpu.util_sm / 100.0 for gpu in gpus}
        suspended = {job_id for job_id in running if self.runner.duty_cycle(job_id) <= 0}
        for change in self.coordinator.step(time.monotonic(), utilisation, suspended):
            if not self.runner.set_duty_cycle(change.job_id, change.duty_cycle):
                continue  # (ending: nothing to throttle)
            self.local_duty_changes += 1
            if change.gpu_index is None:
                log.info("job %d (borrower): duty cycle %.2f -> %.2f on this node (%s)", change.job_id,
                         change.before, change.duty_cycle, change.reason)
            else:
                log.info("job %d (borrower): duty cycle %.2f -> %.2f on this node (%s: GPU %d at %.0f%% beside "
                         "guaranteed job %s; ceiling %.2f)", change.job_id, change.before, change.duty_cycle,
                         change.reason, change.gpu_index, 100 * change.utilisation,
                         ", ".join(map(str, change.guaranteed)), self.coordinator.ceiling(change.job_id))

    def _coordinated(self, job_id: int) -> None:
        """Make sure the coordinator knows the running job (launched here, or adopted from an
        earlier agent): its class, GPUs, floor, and the duty cycle the control plane launched it at."""
        if job_id in self.coordinator.known():
            return
        launch = self.runner.launch_of(job_id)
        if launch is None:
            return
        self.coordinator.admit(
            Resident(job_id, launch.job_class, tuple(launch.gpu_indices), launch.duty_cycle_floor, launch.duty_cycle),
            duty_cycle=self.runner.duty_cycle(job_id) or None,  # (0: suspended; it resumes at its launch's)
        )

    def _set_duty_cycle(self, command: protocol.SetDutyCycle) -> bool:
        """The control plane's duty cycle: as sent for most jobs; a borrower's ceiling (it runs at
        most that, and lower while the node holds it down beside a saturated guaranteed job)."""
        self._coordinated(command.job_id)
        duty = self.coordinator.set_ceiling(command.job_id, command.duty_cycle)
        if duty is None:
            return self.runner.set_duty_cycle(command.job_id, command.duty_cycle)
        if duty < command.duty_cycle:
            log.info("job %d (borrower): the control plane's duty cycle %.2f is its ceiling; the node holds it at "
                     "%.2f", command.job_id, command.duty_cycle, duty)
        return self.runner.set_duty_cycle(command.job_id, duty)

    def _sample_failed(self, what: str, exc: Exception | None) -> None:
        key = f"{what}: {exc!r}"[:300]
        if key in self._sample_failures:
            return
        if len(self._sample_failures) < 1000:
            self._sample_failures.add(key)
        log.error("sample: %s%s (logged once)", what, f": {exc!r}" if exc is not None else "", exc_info=exc)

    def _ship_output(self) -> None:
        """Send what each running job wrote to its output.log since the last call (one signed
        JobOutput per job, at most OUTPUT_CHUNK_BYTES; OUTPUT_NODE_BYTES in all), and the last of
        the jobs that ended since. Nothing is buffered while Redis is away: a live tail resumes
        at the newest output."""
        now = time.monotonic()
        self._next_output = now + self.interval
        launches = self.runner.running_launches()
        for job_id in list(self._output):
            if self._output[job_id].ended:
                del self._output[job_id]  # its last output was read the time before
        budget = OUTPUT_NODE_BYTES
        entries = []
        order = sorted(set(launches) | set(self._output),
                       key=lambda job: self._output[job].shipped_at if job in self._output else 0.0)
        for job_id in order:
            if budget <= 0 or len(entries) >= OUTPUT_NODE_CHUNKS:
                break
            launch_id = launches.get(job_id)
            cursor = self._output.get(job_id)
            if launch_id is not None and (cursor is None or cursor.launch_id != launch_id):
                cursor = self._output[job_id] = _OutputCursor(launch_id)  # a new attempt: from its start
            cursor.ended = launch_id is None
            chunk = read_output(self.runner.job_dir(job_id) / "output.log", cursor.offset, cursor.anchor,
                                min(OUTPUT_CHUNK_BYTES, budget), OUTPUT_LAG_BYTES)
            if chunk is None or not chunk.data:
                continue
            message = protocol.JobOutput(
                node=self.node, job_id=job_id, launch_id=cursor.launch_id,
                offset=chunk.offset, length=len(chunk.data), gap=chunk.gap,
                data=chunk.data.decode("utf-8", errors="replace"),
            )
            entries.append((cursor, chunk, signing.signed(protocol.encode(message), self._key)))
            budget -= len(chunk.data)
        if not entries:
            return
        pipe = self._redis.pipeline(transaction=False)
        for _cursor, _chunk, fields in entries:
            pipe.xadd(protocol.node_logs_stream(self.node), fields, maxlen=OUTPUT_STREAM_MAXLEN, approximate=True)
        pipe.execute()
        for cursor, chunk, _fields in entries:  # advanced only once Redis has the chunk
            cursor.offset, cursor.anchor, cursor.shipped_at = chunk.offset + len(chunk.data), chunk.anchor, now
            self.shipped_output_bytes += len(chunk.data)

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

    # ------------------------------------------------------------------ incoming

    def _read_commands(self) -> None:
        if self._read_pending:
            # Our own delivered-but-unacked entries first (id "0"); they come back immediately.
            reply = self._redis.xreadgroup(
                protocol.AGENT_COMMAND_GROUP, self.node, {self.stream: "0"}, count=READ_COUNT
            )
            entries = _entries(reply)
            if not entries:
                self._read_pending = False
                return
        else:
            reply = self._redis.xreadgroup(
                protocol.AGENT_COMMAND_GROUP,
                self.node,
                {self.stream: ">"},
                count=READ_COUNT,
                # Back in time for the next sample (which is also when the heartbeat is due).
                block=max(1, int(min(self.interval, self._next_sample - time.monotonic()) * 1000)),
            )
            entries = _entries(reply)
            page = entries
            while len(page) == READ_COUNT and len(entries) < READ_BACKLOG:
                page = _entries(self._redis.xreadgroup(protocol.AGENT_COMMAND_GROUP, self.node, {self.stream: ">"},
                                                       count=READ_COUNT))
                entries = entries + page
        if not entries:
            return
        seconds, micros = self._redis.time()
        now_ms = seconds * 1000 + micros // 1000
        withdrawn = self._withdrawn_launches(entries)
        for entry_id, fields in entries:
            self._handle_entry(entry_id, fields, waited_s=max(0.0, (now_ms - _entry_ms(entry_id)) / 1000),
                               withdrawn=entry_id in withdrawn)
            self._redis.xack(self.stream, protocol.AGENT_COMMAND_GROUP, entry_id)

    def _withdrawn_launches(self, entries) -> set:
        """Ids of the launch entries that a later entry of the same batch withdraws: a stop of that
        attempt (or of any attempt of the job), or a launch of a newer attempt. Starting one would
        run an attempt the control plane has already given up (a paused agent's backlog holds
        both the launch and, further on, the stop that requeue sent). Only commands this node would
        apply count."""
        withdrawn, stopped, newest = set(), {}, {}
        for entry_id, fields in reversed(entries):
            if fields is None:
                continue
            try:
                command = protocol.decode_command(fields)
            except protocol.ProtocolError:
                continue
            if self._authenticate(fields, command):
                continue
            if isinstance(command, protocol.StopJob):
                stopped.setdefault(command.job_id, set()).add(command.launch_id)
            elif isinstance(command, protocol.LaunchJob):
                stops = stopped.get(command.job_id, ())
                later = newest.get(command.job_id)
                if None in stops or command.command_id in stops or (
                        later is not None and command.attempt is not None and later > command.attempt):
                    withdrawn.add(entry_id)
                if command.attempt is not None:
                    newest[command.job_id] = max(command.attempt, later if later is not None else command.attempt)
        return withdrawn

    def _handle_entry(self, entry_id, fields, *, waited_s: float = 0.0, withdrawn: bool = False) -> None:
        """Apply one command entry. ``waited_s``: how long it sat in the stream; ``withdrawn``: a
        later entry read with it withdraws it (a launch; see :meth:`_withdrawn_launches`)."""
        if fields is None:
            # A pending entry trimmed from the stream before we acked it: nothing left to apply.
            self._dead_letter(entry_id, {}, "entry was deleted from the stream before it was applied")
            return
        try:
            command = protocol.decode_command(fields)
        except protocol.ProtocolError as exc:
            self._dead_letter(entry_id, fields, exc.reason)
            return
        refusal = self._authenticate(fields, command)
        if refusal:
            # Applied not at all, and not remembered: a genuine command refused as stale is
            # re-sent freshly issued, with the same command id, and must then run.
            self._dead_letter(entry_id, fields, f"command {command.command_id} refused: {refusal}"[:500])
            return
        # A launch's attempt fences it: one older than an attempt seen here for the job is a
        # replay (or a straggler) and refused even if its command id was forgotten; a re-send of
        # the newest attempt is the usual harmless duplicate, known by its command id.
        seen = self._launch_attempts.get(command.job_id) if isinstance(command, protocol.LaunchJob) else None
        if seen is not None and command.attempt is not None and command.attempt < seen:
            self._dead_letter(entry_id, fields, f"command {command.command_id} refused: launch attempt "
                              f"{command.attempt} of job {command.job_id} is older than attempt {seen} seen here")
            return
        taken_not_started = False
        if command.command_id in self._applied_commands:
            taken_not_started = isinstance(command, protocol.LaunchJob) and self._taken_not_started(command)
            if not taken_not_started:
                log.info("command %s already applied; skipping", command.command_id)
                if isinstance(command, protocol.LaunchJob) and not self._adopted_late(command.job_id, command.command_id):
                    self._answer_resent_launch(command)
                return
            log.warning("launch %s: an earlier agent on this node took it and stopped before starting job %d; "
                        "starting it now", command.command_id, command.job_id)
        if isinstance(command, protocol.LaunchJob) and command.attempt is not None and not taken_not_started:
            if seen is not None and command.attempt <= seen:
                self._dead_letter(entry_id, fields, f"command {command.command_id} refused: launch attempt "
                                  f"{command.attempt} of job {command.job_id} is not newer than attempt {seen} "
                                  "seen here")
                return
        if isinstance(command, protocol.LaunchJob) and (withdrawn or waited_s > self.launch_lease):
            # Not started, not remembered: if the control plane still holds this attempt, its
            # re-send (same command id, issued afresh) runs it.
            self.stale_launches += 1
            log.warning("launch %s of job %d not started: %s", command.command_id, command.job_id,
                        "withdrawn by a later command in this stream" if withdrawn else
                        f"it waited {waited_s:.0f}s in the stream (at most {self.launch_lease:.0f}s); "
                        "a fresh re-send will run it if the attempt still stands")
            return
        applied = True
        try:
            if isinstance(command, protocol.LaunchJob):
                applied = self._launch(command)
            elif isinstance(command, protocol.StopJob):
                self._stop_job(command)
            elif isinstance(command, protocol.QueryAttempt):
                self._answer_query(command)
            elif isinstance(command, protocol.SetDutyCycle):
                self._not_here(command, self._set_duty_cycle(command))
            elif isinstance(command, protocol.SuspendJob):
                self._not_here(command, self.runner.suspend(command.job_id))
            elif isinstance(command, protocol.ResumeJob):
                self._not_here(command, self.runner.resume(command.job_id))
        except redis.RedisError:
            raise  # not the command's fault: reconnect and re-read it from the pending list
        except Exception as exc:
            # A bug here must not take the node's running jobs down with the agent, nor be
            # retried forever: park the command where operators look, and move on.
            log.exception("command %s could not be applied", command.command_id)
            self._dead_letter(entry_id, fields, f"agent failed to apply the command: {exc!r}"[:500])
        if not applied:
            return  # deferred: the control plane sends it again, and then it runs
        self._applied_commands.add(command.command_id)
        if isinstance(command, protocol.LaunchJob):
            self._launched_at[command.command_id] = time.monotonic()
            while len(self._launched_at) > MEMORY_SIZE:
                self._launched_at.popitem(last=False)
        if isinstance(command, protocol.LaunchJob) and command.attempt is not None:
            self._launch_attempts[command.job_id] = command.attempt
            self._launch_attempts.move_to_end(command.job_id)
            while len(self._launch_attempts) > MEMORY_SIZE:
                self._launch_attempts.popitem(last=False)

    def _remember_launches(self, launches: list[protocol.LaunchJob]) -> None:
        """What an earlier agent on this node launched: a re-send of one of those (the control
        plane's, after the start report was lost) or a replay is then skipped or refused as it
        would have been by that agent, instead of running the attempt a second time."""
        for launch in launches:
            self._applied_commands.add(launch.command_id)
            if launch.attempt is not None and launch.attempt >= self._launch_attempts.get(launch.job_id, -1):
                self._launch_attempts[launch.job_id] = launch.attempt

    def _authenticate(self, fields: dict, command) -> str | None:
        """Why ``command`` (parsed from ``fields``) must not be applied here, or None.

        With a key: it must be MACed with this node's key in the command domain, name this node,
        and have been issued within ``command_max_age`` (and not beyond ``command_max_skew`` ahead).
        A launch must name its attempt (checked against the newest seen by the caller). Without a
        key (authentication off) only a command naming another node is refused.
        """
        if self._key is None:
            if command.node is not None and command.node != self.node:
                return f"it is for node {command.node}, not {self.node}"
            return None
        signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
        if signature is None:
            return "unsigned (this agent takes only commands MACed with its node key)"
        if not signing.verify_command(self._key, fields.get("m", fields.get(b"m")), signature):
            return "bad signature (not MACed with this node's key)"
        if command.node != self.node:
            # Genuine, but for another node (copied into this stream, or sent before a rename).
            return f"it is for node {command.node}, not {self.node}" if command.node else "it names no node"
        if command.issued_at is None:
            return "it carries no issue time"
        age = time.time() - command.issued_at
        if age > self.command_max_age:
            return f"stale: issued {age:.0f}s ago (at most {self.command_max_age:.0f}s)"
        if -age > self.command_max_skew:
            return f"issued {-age:.0f}s in the future (clock skew of at most {self.command_max_skew:.0f}s)"
        if isinstance(command, protocol.LaunchJob) and command.attempt is None:
            return "a launch that names no attempt"
        return None

    def _launch(self, command: protocol.LaunchJob) -> bool:
        """Start the attempt; False when it must wait (an earlier attempt still runs here)."""
        job_id = command.job_id
        # A second launch of a job that ran here before is a new attempt (requeued after its node
        # was lost, or preempted): the control plane gives every attempt its own command id, and
        # re-deliveries of one command are caught by command id above.
        running = self.runner.launch_of(job_id)
        if running is not None:
            if running.command_id == command.command_id or not _older(running, command):
                log.info("job %d already running on this node (%s); ignoring launch %s", job_id,
                         running.command_id, command.command_id)
                return True
            # An earlier attempt outlived its stop (lost with a partition, say): end it first; the
            # control plane re-sends this launch, which runs once that one is gone.
            log.warning("job %d: attempt %s still runs here; stopping it before launching %s", job_id,
                        running.command_id, command.command_id)
            self.runner.stop(job_id, command.stop_grace_s)
            return False
        missing = sorted(set(command.gpu_indices) - self._gpu_indices)
        try:
            if missing:
                raise LaunchError(
                    f"GPU index {missing} not on node {self.node} (it has {sorted(self._gpu_indices)})"
                )
            archive = None
            if self.runner.needs_code(command):
                # Here, not in the runner: the agent holds the node's Redis connection. A Redis
                # error is the connection's fault and re-reads the launch once reconnected.
                try:
                    archive = code.fetch(self._redis, self.node, command.code)
                except code.CodeError as exc:
                    raise LaunchError(str(exc)) from None
            pid = self.runner.launch(command, code_archive=archive)
        except LaunchError as exc:
            log.warning("job %d could not start: %s", job_id, exc)
            self._publish(
                protocol.JobExited(
                    node=self.node, job_id=job_id, exit_code=None, error=str(exc)[:2000], finished_at=time.time(),
                    launch_id=command.command_id,
                )
            )
            return
        self.coordinator.forget(job_id)  # (an earlier attempt's, if one ended since the last sample)
        self._coordinated(job_id)
        self._publish(protocol.JobStarted(node=self.node, job_id=job_id, pid=pid, started_at=time.time(),
                                          launch_id=command.command_id))
        return True

    def _attempt_report(self, job_id: int, launch_id: str) -> protocol.JobStarted | protocol.JobExited | None:
        """How the attempt stands here, as its report: its start again while it runs, its exit
        again if it ended here lately; None if this node does not know it."""
        running = self.runner.launch_of(job_id)
        if running is not None and running.command_id == launch_id:
            pid = self.runner.processes()[job_id].pid
            return protocol.JobStarted(node=self.node, job_id=job_id, pid=pid, started_at=time.time(),
                                       launch_id=launch_id)
        return self._recent_exit(job_id, launch_id)

    def _adopted_late(self, job_id: int, launch_id: str) -> bool:
        """Whether the attempt was one an earlier agent's supervisor ran unseen by this agent
        (``JobRunner.adopt_late``), now taken over and said to run; its exit, if it ended, is sent now."""
        if self.runner.launch_of(job_id) is not None:
            return False  # (known here: it runs under this agent)
        if self._ended_late(job_id, launch_id):
            return True
        if self.runner.launch_of(job_id) is None:
            return False
        self._publish(self._attempt_report(job_id, launch_id))  # (adopted: it runs)
        return True

    def _ended_late(self, job_id: int, launch_id: str | None) -> bool:
        """Take over the attempt an earlier agent left unseen (``JobRunner.adopt_late``), sending
        the exits that turned up; whether the job's own was among them."""
        try:
            finished = self.runner.adopt_late(job_id, launch_id, self.shutdown_grace)
        except Exception:  # (never the end of the agent, and of every job with it)
            log.exception("job %d: could not look for an attempt an earlier agent left", job_id)
            return False
        for ended in finished:
            self._publish(self._exited(ended))
        return any(ended.job_id == job_id for ended in finished)

    def _answer_query(self, command: protocol.QueryAttempt) -> None:
        """Say how the attempt stands here, changing nothing (see :class:`protocol.QueryAttempt`)."""
        if self._adopted_late(command.job_id, command.launch_id):
            return
        self._publish(self._attempt_report(command.job_id, command.launch_id) or protocol.JobExited(
            node=self.node, job_id=command.job_id, exit_code=None, absent=True, launch_id=command.launch_id,
            error="this node does not know that attempt", finished_at=time.time()))

    def _taken_not_started(self, command: protocol.LaunchJob) -> bool:
        """A re-sent launch that an earlier agent on this node took (this agent remembers it as
        applied, from its launch record) and died before starting: nothing ran and nothing will
        report, so the job would stay PLACED for ever. Not one this agent applied itself, nor one
        whose attempt this node can say anything about."""
        return (command.command_id not in self._launched_at
                and self._attempt_report(command.job_id, command.command_id) is None
                and self.runner.never_started(command))

    def _answer_resent_launch(self, command: protocol.LaunchJob) -> None:
        """The control plane re-sends a launch when the job has not been seen to start: its start,
        or its start and its exit, were lost (a Redis restart, an agent killed after sending).
        Say again how that attempt stands here; never run it a second time."""
        applied_at = self._launched_at.get(command.command_id)
        if applied_at is not None and time.monotonic() - applied_at < REANSWER_AFTER_S:
            return
        report = self._attempt_report(command.job_id, command.command_id)
        if report is not None:
            log.info("launch %s: job %d was launched here already; reporting its %s again", command.command_id,
                     command.job_id, "start" if isinstance(report, protocol.JobStarted) else "exit")
            self._publish(report)

    def _stop_job(self, command: protocol.StopJob) -> None:
        running = self.runner.running_launches().get(command.job_id)
        if running is None:  # (an attempt an earlier agent left, unseen so far, is stopped too)
            if self._ended_late(command.job_id, command.launch_id):
                return  # (it had ended: that is the answer)
            running = self.runner.running_launches().get(command.job_id)
        if running is not None and command.launch_id in (None, running):
            self.runner.stop(command.job_id, command.grace_seconds, preempt=command.preempt)
            return
        # Not running here, or running as a later attempt than the one to stop. Say how that
        # attempt ended if this node ran it (its exit may have been lost with a trimmed stream or
        # a Redis restart), else that it is absent: a job whose launch never arrived (or whose
        # exit was lost for good) would otherwise wait forever to be stopped.
        known = self._recent_exit(command.job_id, command.launch_id)
        if known is not None:
            log.info("stop %s: job %d attempt %s ended here already; reporting its exit again",
                     command.command_id, command.job_id, command.launch_id)
            self._publish(known)
            return
        log.info("stop %s: job %d (%s) is not running here", command.command_id, command.job_id,
                 command.launch_id or "any attempt")
        self._publish(protocol.JobExited(node=self.node, job_id=command.job_id, exit_code=None, stopped=True,
                                         absent=True, error="not running on this node when told to stop",
                                         launch_id=command.launch_id, finished_at=time.time()))

    def _recent_exit(self, job_id: int, launch_id: str | None) -> protocol.JobExited | None:
        if launch_id is None:
            return None
        for _sent_at, message in reversed(self._recent_exits):
            if message.job_id == job_id and message.launch_id == launch_id and not message.absent:
                return message
        return None

    @staticmethod
    def _not_here(command, applied: bool) -> None:
        if not applied:
            # Finished, stopping, or never here: the server learns the job's fate from its events.
            log.info("%s %s: job %d is not running here; nothing to do", command.kind, command.command_id, command.job_id)

    def _dead_letter(self, entry_id, fields: dict, reason: str) -> None:
        """Report a refused command entry; the control plane dead-letters it (this node may write
        only its own streams). The reason says what is wrong; no excerpt of the entry travels, as
        even one that does not parse (a launch too large to accept, say) may hold a job's ``env``."""
        log.warning("command entry %s rejected: %s", _text(entry_id), reason)
        self._publish(protocol.CommandRejected(node=self.node, entry_id=_text(entry_id)[:64], reason=reason[:500]))


def _older(running: protocol.LaunchJob, incoming: protocol.LaunchJob) -> bool:
    """Whether the running launch is an earlier attempt than the incoming one."""
    return running.attempt is not None and incoming.attempt is not None and running.attempt < incoming.attempt


def _entry_ms(entry_id) -> int:
    """The Redis server time (ms) at which a stream entry was added: the first part of its id."""
    return int(_text(entry_id).split("-", 1)[0])


def _entries(reply) -> list:
    """The (id, fields) pairs of a one-stream XREADGROUP reply (RESP2: [[stream, entries]])."""
    return reply[0][1] if reply else []


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _exit_line(at: float, message: protocol.JobExited) -> str:
    """One line of RECENT_EXITS_FILE: when the exit was sent (wall clock) and the exit."""
    return json.dumps({"at": at, "exit": message.model_dump(mode="json")}) + "\n"


def _private(path, flags):
    """``open(..., opener=_private)``: the file readable by this user only, never followed through a link."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
