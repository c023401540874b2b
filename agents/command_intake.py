"""Command intake: the node's command stream, read through a consumer group
(:mod:`agents.streams`), each entry checked (:mod:`agents.command_checks`) and applied once:
launch, stop, query, duty cycle, suspend, resume. Each is acked whatever became of it; a refused
or broken one is reported to the control plane with the reason (it dead-letters it).

A launch starts only for the attempt the control plane holds now: commands are read in batches
(a paused agent's whole backlog), a launch that a later entry withdraws (its stop, a newer
attempt) is dropped, and one that waited in the stream past ``launch_lease`` waits for the control
plane's fresh re-send, which comes only while the attempt still stands. A re-sent launch, a stop
or a query about an attempt is answered with how that attempt stands here; an attempt is never
run twice.

What must not live here: the connection and the outbox (:mod:`agents.agent`), process handling
(:mod:`agents.runner`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

import redis

from agents import code, protocol, streams
from agents.command_checks import entry_ms, older, refusal, text, withdrawn_launches
from agents.job_launching import LaunchError
from agents.local_duty import LocalDuty
from agents.recent_exits import RecentExits

log = logging.getLogger(__name__)

READ_COUNT = 32
# Entries read (in READ_COUNT pages) before any is applied: a launch is weighed against what
# follows it in its stream (see ``withdrawn_launches``), e.g. a paused agent's whole backlog.
READ_BACKLOG = 1024
# A launch starts only for the attempt the control plane holds now. One that waited in the stream
# longer than this (its agent paused, or starved on a loaded machine) may have been requeued
# since: it is not started, and the control plane's re-send, issued afresh every
# COLONY_RESEND_AFTER_S (15 s) while the job is still placed, confirms the attempt and runs.
# Timed on Redis's clock (entry id against TIME), so the node's clock plays no part.
LAUNCH_LEASE_S = 10.0
# A launch delivered again this soon after this agent applied it is a duplicate delivery, whose
# reports are still on their way: it changes nothing and says nothing. Later (the control plane
# re-sends after 15 s without a start) it is answered with how the attempt stands.
REANSWER_AFTER_S = 5.0
# How many applied command ids are remembered for idempotency. Commands are
# re-delivered only shortly after they were sent (pending entries, duplicates), so this is plenty.
MEMORY_SIZE = 10_000
# A signed command older than this is refused (a captured one cannot be replayed later); one
# issued further than COMMAND_MAX_SKEW_S ahead of this node's clock too. The control plane re-sends
# what is still wanted (launches of placed jobs, stops), freshly issued.
COMMAND_MAX_AGE_S = 300.0
COMMAND_MAX_SKEW_S = 30.0


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


class CommandIntake:
    """The commands of one node. ``publish`` queues a report for the events stream;
    ``exit_report`` words a finished job's exit; ``gpu_indices`` (the GPUs this node registered)
    is set by the agent when it registers."""

    def __init__(self, node: str, runner, *, publish: Callable, exit_report: Callable,
                 recent_exits: RecentExits, local_duty: LocalDuty, key: bytes | None,
                 max_age: float, max_skew: float, launch_lease: float, grace: float):
        self.node, self.runner = node, runner
        self.stream = protocol.command_stream(node)
        self._publish, self._exit_report = publish, exit_report
        self._recent_exits, self.local_duty = recent_exits, local_duty
        self._key, self._max_age, self._max_skew = key, max_age, max_skew
        self.launch_lease = launch_lease
        self._grace = grace
        self.gpu_indices: set[int] = set()
        self.read_pending = True  # entries delivered before a reconnect but never acked come first
        self.stale_launches = 0  # launches not started because they waited past the lease, or were withdrawn
        self._applied_commands = _BoundedSet(MEMORY_SIZE)
        self._launched_at: OrderedDict[str, float] = OrderedDict()  # launch command id -> when applied here
        # job id -> the newest launch attempt seen for it (least recently launched forgotten first).
        self._launch_attempts: OrderedDict[int, int] = OrderedDict()
        # Launch command ids a stop named: the control plane gave those attempts up, so their
        # launch, arriving after the stop (re-sent, duplicated, reordered), must never start.
        self._stopped_launches = _BoundedSet(MEMORY_SIZE)

    def read(self, client: redis.Redis, block_ms: int) -> None:
        """Read a batch (blocking at most ``block_ms`` for the first entry), apply and ack it."""
        group = protocol.AGENT_COMMAND_GROUP
        if self.read_pending:
            # Our own delivered-but-unacked entries first (id "0"); they come back immediately.
            entries = streams.read_pending(client, self.stream, group, self.node, READ_COUNT)
            if not entries:
                self.read_pending = False
                return
        else:
            entries = streams.read_new(client, self.stream, group, self.node, READ_COUNT, block_ms)
            page = entries
            while len(page) == READ_COUNT and len(entries) < READ_BACKLOG:
                page = streams.read_new(client, self.stream, group, self.node, READ_COUNT)
                entries = entries + page
        if not entries:
            return
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        withdrawn = withdrawn_launches(entries, self._refusal)
        for entry_id, fields in entries:
            self._handle_entry(client, entry_id, fields, waited_s=max(0.0, (now_ms - entry_ms(entry_id)) / 1000),
                               withdrawn=entry_id in withdrawn)
            client.xack(self.stream, group, entry_id)

    def _refusal(self, fields: dict, command) -> str | None:
        return refusal(fields, command, node=self.node, key=self._key, max_age=self._max_age,
                       max_skew=self._max_skew)

    def _handle_entry(self, client, entry_id, fields, *, waited_s: float = 0.0, withdrawn: bool = False) -> None:
        """Apply one command entry. ``waited_s``: how long it sat in the stream; ``withdrawn``: a
        later entry read with it withdraws it (a launch; see :func:`agents.command_checks.withdrawn_launches`)."""
        if fields is None:
            # A pending entry trimmed from the stream before we acked it: nothing left to apply.
            self._dead_letter(entry_id, {}, "entry was deleted from the stream before it was applied")
            return
        try:
            command = protocol.decode_command(fields)
        except protocol.ProtocolError as exc:
            self._dead_letter(entry_id, fields, exc.reason)
            return
        refusal = self._refusal(fields, command)
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
                if (isinstance(command, protocol.LaunchJob)
                        and not self._adopted_late(command.job_id, command.command_id)):
                    self._answer_resent_launch(command)
                return
            log.warning("launch %s: an earlier agent on this node took it and stopped before starting job %d; "
                        "starting it now", command.command_id, command.job_id)
        if isinstance(command, protocol.LaunchJob) and command.command_id in self._stopped_launches:
            # Its stop came first (a re-sent launch of an attempt whose node was since lost and
            # whose job was requeued, within the launch lease): starting it would run the job
            # beside its next attempt, and run it twice.
            self.stale_launches += 1
            self._dead_letter(entry_id, fields, f"command {command.command_id} refused: attempt "
                              f"{command.attempt} of job {command.job_id} was stopped here before its launch came")
            return
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
                applied = self._launch(client, command)
            elif isinstance(command, protocol.StopJob):
                self._stop_job(command)
            elif isinstance(command, protocol.QueryAttempt):
                self._answer_query(command)
            elif isinstance(command, protocol.SetDutyCycle):
                self._not_here(command, self.local_duty.set_by_control_plane(command))
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

    def remember_launches(self, launches: list[protocol.LaunchJob]) -> None:
        """What an earlier agent on this node launched: a re-send of one of those (the control
        plane's, after the start report was lost) or a replay is then skipped or refused as it
        would have been by that agent, instead of running the attempt a second time."""
        for launch in launches:
            self._applied_commands.add(launch.command_id)
            if launch.attempt is not None and launch.attempt >= self._launch_attempts.get(launch.job_id, -1):
                self._launch_attempts[launch.job_id] = launch.attempt

    def _launch(self, client, command: protocol.LaunchJob) -> bool:
        """Start the attempt; False when it must wait (an earlier attempt still runs here)."""
        job_id = command.job_id
        # A second launch of a job that ran here before is a new attempt (requeued after its node
        # was lost, or preempted): the control plane gives every attempt its own command id, and
        # re-deliveries of one command are caught by command id above.
        running = self.runner.launch_of(job_id)
        if running is not None:
            if running.command_id == command.command_id or not older(running, command):
                log.info("job %d already running on this node (%s); ignoring launch %s", job_id,
                         running.command_id, command.command_id)
                return True
            # An earlier attempt outlived its stop (lost with a partition, say): end it first; the
            # control plane re-sends this launch, which runs once that one is gone.
            log.warning("job %d: attempt %s still runs here; stopping it before launching %s", job_id,
                        running.command_id, command.command_id)
            self.runner.stop(job_id, command.stop_grace_s)
            return False
        missing = sorted(set(command.gpu_indices) - self.gpu_indices)
        try:
            if missing:
                raise LaunchError(
                    f"GPU index {missing} not on node {self.node} (it has {sorted(self.gpu_indices)})"
                )
            archive = None
            if self.runner.needs_code(command):
                # Here, not in the runner: the agent holds the node's Redis connection. A Redis
                # error is the connection's fault and re-reads the launch once reconnected.
                try:
                    archive = code.fetch(client, self.node, command.code)
                except code.CodeError as exc:
                    raise LaunchError(str(exc)) from None
            pid = self.runner.launch(command, code_archive=archive)
        except LaunchError as exc:
            # The attempt is over here: the control plane may already retry it on another node. It
            # counts as applied (its failure is among the recent exits, as every exit published),
            # so a re-send is answered with the failure and never starts it: a fault that passed
            # would run the job twice.
            log.warning("job %d could not start: %s", job_id, exc)
            self._publish(protocol.JobExited(node=self.node, job_id=job_id, exit_code=None, error=str(exc)[:2000],
                                             finished_at=time.time(), launch_id=command.command_id))
            return True
        self.local_duty.started(job_id)
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
        return self._recent_exits.find(job_id, launch_id)

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
            finished = self.runner.adopt_late(job_id, launch_id, self._grace)
        except Exception:  # (never the end of the agent, and of every job with it)
            log.exception("job %d: could not look for an attempt an earlier agent left", job_id)
            return False
        for ended in finished:
            self._publish(self._exit_report(ended))
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
        if command.launch_id is not None:
            self._stopped_launches.add(command.launch_id)
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
        known = self._recent_exits.find(command.job_id, command.launch_id)
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

    @staticmethod
    def _not_here(command, applied: bool) -> None:
        if not applied:
            # Finished, stopping, or never here: the server learns the job's fate from its events.
            log.info("%s %s: job %d is not running here; nothing to do", command.kind, command.command_id,
                     command.job_id)

    def _dead_letter(self, entry_id, fields: dict, reason: str) -> None:
        """Report a refused command entry; the control plane dead-letters it (this node may write
        only its own streams). The reason says what is wrong; no excerpt of the entry travels, as
        even one that does not parse (a launch too large to accept, say) may hold a job's ``env``."""
        log.warning("command entry %s rejected: %s", text(entry_id), reason)
        self._publish(protocol.CommandRejected(node=self.node, entry_id=text(entry_id)[:64], reason=reason[:500]))
