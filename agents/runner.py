"""Starts, stops and reaps job processes on this node. No Redis and no protocol I/O here.

Each job is owned by its own supervisor process (:mod:`agents.supervise`, the role of Slurm's
``slurmstepd``), which the runner starts in a session of its own: the supervisor starts the job's
argv without a shell as the leader of a further session and process group, so that stopping a job
reaches everything it spawned (data loader workers, ``torchrun`` children), and nothing of a job
outlives it. A process that calls ``setsid()`` itself escapes the group; the job's cgroup
(:mod:`agents.isolation.cgroups`, killed whole when the job ends) contains it where the node has one.

Jobs are contained by what the agent decides, never by the job spec (``LaunchJob`` has no
shell or user to ask for; its ``workdir``, ``code``, ``venv``/``conda`` and ``image`` only choose
where the job starts and with what software, see :mod:`agents.environments`, :mod:`agents.code`
and :mod:`agents.containers`):

- the process runs as the account :class:`agents.accounts.RunAsPolicy` picks, its researcher's
  own (the supervisor's ``Popen`` drops to its uid, gid and supplementary groups before exec), and
  an agent running as root refuses a job it has no unprivileged account for unless told otherwise;
- its environment is an allow-list of the agent's variables plus the spec's and Colony's own,
  never the agent's whole environment (which may hold the Redis password) nor its PATH; a spec
  that sets a variable changing who the job is (``HOME``, ``LD_PRELOAD``...) is refused unless the
  operator allows it; the spec reaches the supervisor on its stdin, never on a command line or in
  its environment;
- its output goes through a pipe into a size-bounded log (:mod:`agents.joblog`) that the
  supervisor writes.

Layout under ``workdir``: ``jobs/<job_id>/`` belongs to the agent (readable by the job's group)
and holds ``output.log``, the job's stdout and stderr; ``launch.json`` (the LaunchJob, mode 600:
it holds the job's environment); ``process.json`` (the job's leader pid and start time and its
supervisor's, written by the supervisor); ``spawned.json`` (written by the agent before it spawns
the supervisor, marked ``ended`` before the records of that attempt go: the attempt may have run)
and ``supervisor.lock`` (mode 600, held by the supervisor for its life: see ``never_started``);
``stop.json`` (written by the agent when it ends the job:
why, and when SIGKILL is due); ``exit.json`` (the job's exit, written atomically by the supervisor
when it ends); ``supervisor.log``; ``notice/preempt_at`` (the job's ``COLONY_PREEMPT_FILE``: the
SIGKILL deadline of a preemption, written before the stop signal; in a directory of its own,
readable by the job's group, so that a container can mount it read-only). ``jobs/<job_id>/work/``
is the job's working directory unless the launch names a ``workdir`` or ``code``;
``jobs/<job_id>/code-<sha>/`` is an unpacked code archive, kept across attempts of the job (its
checkpoints survive a requeue). Both are owned by the job's account. The job cannot write to its
log other than through the pipe, nor swap it for a link to a file it should not read.

Jobs survive their agent: an agent that dies (SIGKILL, a crash) leaves its jobs running under
their supervisors, which keep writing their output and write their exit. The next agent on the
node re-adopts them before it registers (:meth:`JobRunner.recover`): a job whose leader is alive
(same pid and start time) with its supervisor is reported as running again and throttled, stopped
and reaped as if this agent had started it; a job that ended while no agent ran is reported from
its ``exit.json``. Only processes nobody supervises any more (their supervisor died, or a record
of an agent from before supervisors) are stopped and reported for a requeue, as before, so a job
never runs twice at once. A clean agent shutdown still stops every job (:meth:`JobRunner.stop_all`).

Stop, throttling (:class:`agents.duty_cycler.DutyCycler`, its own thread) and suspension signal the
job's process group from the agent; every such signal first checks that the leader is the same,
not yet reaped process (a pidfd held since launch or adoption), and the runner tells the cycler to
forget a job before it reports the job's exit, so no signal can reach a reused process group id.

The runner holds the table of running jobs and decides; the steps live beside it, each with no
state of its own: :mod:`agents.job_launching` (directories, environment, the supervisor's answer),
:mod:`agents.job_processes` (leader, supervisor, the exit reported), :mod:`agents.job_records`
(the files above), :mod:`agents.job_adoption` (jobs of an earlier agent) and
:mod:`agents.job_output` (reading ``output.log``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from agents import code, containers, environments, notebooks, sessions, supervise, tunnel_protocol
from agents.accounts import DEFAULT_PASS_ENV, Account, NoAccount, RunAsPolicy
from agents.backends.base import JobProcesses
from agents.duty_cycler import DEFAULT_PERIOD, DutyCycler
from agents.isolation.layer import IsolationError, IsolationLayer, JobFence
from agents.job_adoption import stop_unsupervised, take_over
from agents.job_launching import (
    LaunchError,
    check_container_fence,
    job_env,
    prepare_directories,
    stop_signal,
    supervisor_answer,
)
from agents.job_output import read_tail
from agents.job_processes import FinishedJob, Leader, RunningJob, Supervisor, reap
from agents.job_records import (
    EXIT_RECORD,
    LAUNCH_RECORD,
    NOTICE_DIR,
    PREEMPT_FILE,
    PROCESS_RECORD,
    SPAWN_RECORD,
    STOP_RECORD,
    SUPERVISOR_START_SECONDS,
    read_launch,
    remove_records,
    spawn_abandoned,
    spawn_ended,
    write_preempt_notice,
    write_stop,
)
from agents.joblog import DEFAULT_MAX_LOG_BYTES
from agents.protocol import LaunchJob, identity_env_names, session_idle_s

# Many importers (tests, bench, the agent) take these from here, not from where they live.
__all__ = ["FinishedJob", "JobRunner", "LaunchError", "SUPERVISOR_START_SECONDS", "read_tail"]

log = logging.getLogger(__name__)


class JobRunner:
    """The job processes of one agent. Not thread-safe: one agent loop drives it."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        duty_period: float = DEFAULT_PERIOD,
        run_as: RunAsPolicy | None = None,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        pass_env: tuple[str, ...] = DEFAULT_PASS_ENV,
        container_runtime: containers.ContainerRuntime | None = None,
        node: str | None = None,
        isolation: IsolationLayer | None = None,
        job_path: tuple[str, ...] = (),
        allowed_env: tuple[str, ...] = (),
    ):
        """``run_as`` picks each job's account; the default one refuses every launch when the
        agent is root. ``max_log_bytes`` bounds each job's ``output.log``; ``pass_env`` names the
        agent's variables (``NCCL_*`` patterns allowed) that jobs inherit. ``container_runtime``
        runs ``image`` jobs (None: they are refused). ``node`` names the node in launch errors.
        ``isolation`` fences jobs on shared GPUs (:mod:`agents.isolation`; None: nothing is fenced).
        ``job_path``: directories put before the system's on every job's PATH. ``allowed_env``:
        names a job may set although they change who it is (``HOME``, ``LD_LIBRARY_PATH``...)."""
        self.workdir = Path(workdir)
        self.container_runtime = container_runtime
        self.node = node  # the agent sets it when None
        self.isolation = isolation if isolation is not None else IsolationLayer.unfenced()
        self.run_as = run_as if run_as is not None else RunAsPolicy()
        self.max_log_bytes = max_log_bytes
        self.pass_env = tuple(pass_env)
        self.job_path = tuple(job_path)
        self.allowed_env = tuple(allowed_env)
        self._jobs: dict[int, RunningJob] = {}
        self._exiting: list[subprocess.Popen] = []  # supervisors that reported an exit, to reap
        # job id -> launch id of exits returned but whose records are kept until the agent says
        # the control plane has them (:meth:`release_reported`).
        self._reported: dict[int, str | None] = {}
        self._cycler = DutyCycler(duty_period, signal_group=self._cycler_signal)

    def job_dir(self, job_id: int) -> Path:
        """The agent's directory for the job: ``output.log`` and the working directory."""
        return self.workdir / "jobs" / str(job_id)

    def work_dir(self, job_id: int) -> Path:
        """The job's working directory, owned by the account it runs as."""
        return self.job_dir(job_id) / "work"

    def preempt_file(self, job_id: int) -> Path:
        """The job's ``COLONY_PREEMPT_FILE``: absent until a preemption's notice."""
        return self.job_dir(job_id) / NOTICE_DIR / PREEMPT_FILE

    def code_dir(self, cmd: LaunchJob) -> Path | None:
        """Where the launch's code archive is (or will be) unpacked; None without one."""
        return None if cmd.code is None else self.job_dir(cmd.job_id) / code.code_dir_name(cmd.code)

    def needs_code(self, cmd: LaunchJob) -> bool:
        """Whether :meth:`launch` needs the archive's bytes: it has code, not yet unpacked (an
        earlier attempt of the job may have unpacked it; that copy is reused)."""
        folder = self.code_dir(cmd)
        return folder is not None and not folder.is_dir()

    def launch(self, cmd: LaunchJob, code_archive: bytes | None = None) -> int:
        """Start the job under a supervisor; return the leader's pid. Launching a running job
        returns its pid again. ``code_archive``: the bytes of ``cmd.code`` (fetched and checked by
        the agent), needed when :meth:`needs_code`."""
        running = self._jobs.get(cmd.job_id)
        if running is not None:
            return running.pid
        refused = identity_env_names(cmd.env, self.allowed_env)
        if refused:
            raise LaunchError(
                f"the job's environment sets {', '.join(refused)}, which would change who the job is or what "
                f"runs inside it; node {self.node or socket.gethostname()} sets HOME, USER and LOGNAME from the "
                "job's account and allows none of these (an operator may allow a name with --allow-job-env)")
        try:
            account = self.run_as.account_for(cmd.tenant, cmd.user, cmd.posix_user)
        except NoAccount as exc:
            raise LaunchError(f"node {self.node or socket.gethostname()}: {exc}") from None
        if cmd.image is not None and self.container_runtime is None:
            raise LaunchError(containers.NO_RUNTIME)
        try:
            if cmd.workdir is not None:
                environments.check_workdir(cmd.workdir, self.node or socket.gethostname())
            environments.check(cmd, self.node or socket.gethostname(), in_image=cmd.image is not None)
        except environments.EnvironmentRefused as exc:
            raise LaunchError(str(exc)) from None
        if self.needs_code(cmd) and code_archive is None:
            raise LaunchError(f"the code archive {cmd.code.sha256[:12]} was not fetched for this launch")
        job_dir, work_dir = self.job_dir(cmd.job_id), self.work_dir(cmd.job_id)
        try:
            prepare_directories(job_dir, work_dir, account)
            for name in (PROCESS_RECORD, EXIT_RECORD, STOP_RECORD, SPAWN_RECORD):  # an earlier attempt's
                (job_dir / name).unlink(missing_ok=True)
            self.preempt_file(cmd.job_id).unlink(missing_ok=True)  # an earlier attempt's notice
            self._reported.pop(cmd.job_id, None)
            supervise.write_json_atomically(job_dir / LAUNCH_RECORD, json.loads(cmd.model_dump_json()), mode=0o600)
        except OSError as exc:
            raise LaunchError(f"cannot prepare job directory {job_dir}: {exc.strerror or exc}") from exc
        try:
            fence = self.isolation.fence(cmd)
        except IsolationError as exc:
            raise LaunchError(str(exc)) from None
        try:
            check_container_fence(cmd, fence, self.container_runtime)
            return self._launch_fenced(cmd, account, job_dir, work_dir, code_archive, fence)
        except BaseException:
            self.isolation.release(cmd.job_id)  # its cgroup, and with it the limits set there
            raise

    def _launch_fenced(self, cmd: LaunchJob, account: Account | None, job_dir: Path, work_dir: Path,
                       code_archive: bytes | None, fence: JobFence) -> int:
        start_dir, argv, env, cleanup = self._start(cmd, account, work_dir, code_archive, fence)
        try:
            supervise.make_lock(job_dir)  # (first: a spawn record always has one; a supervisor needs no space for it)
            supervise.write_json_atomically(job_dir / SPAWN_RECORD, {"launch_id": cmd.command_id}, mode=0o600)
            supervisor_log = os.open(job_dir / supervise.SUPERVISOR_LOG,
                                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LaunchError(f"cannot prepare job directory {job_dir}: {exc.strerror or exc}") from exc
        spec = {
            "job_id": cmd.job_id, "launch_id": cmd.command_id, "argv": argv,
            "env": env, "cwd": str(start_dir), "job_dir": str(job_dir),
            # A relaunch (a new attempt after a requeue) starts a fresh log: the tail the user
            # reads must be this attempt's, not the last one's.
            "log_path": str(job_dir / "output.log"), "max_log_bytes": self.max_log_bytes,
            "log_group": account.gid if account else None,
            "user": account.uid if account else None, "group": account.gid if account else None,
            "extra_groups": list(account.groups) if account else [],
            "max_runtime_s": cmd.max_runtime_s, "stop_grace_s": cmd.stop_grace_s,
            "stop_signal": int(stop_signal(cmd)), "container_cleanup": cleanup,
            "cgroup": str(fence.cgroup) if fence.cgroup is not None else None,
        }
        try:
            process = subprocess.Popen(
                supervise.command(), cwd=job_dir, env={}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=supervisor_log, close_fds=True,
                # Its own session: the agent's death, a killpg of the agent's group or a terminal's
                # Ctrl-C never reaches it, so the job outlives an agent restart.
                start_new_session=True,
            )
        except OSError as exc:
            spawn_ended(job_dir)
            raise LaunchError(f"cannot start the job's supervisor: {exc.strerror or exc}") from exc
        finally:
            os.close(supervisor_log)
        answer = supervisor_answer(process, spec)
        if "error" in answer:
            reap(process)
            spawn_ended(job_dir)  # (refused: never a spawn to run again)
            raise LaunchError(str(answer["error"]))
        leader = Leader.attach(int(answer["pid"]), answer.get("create_time"))
        if leader is None:  # exited (and was reaped) already: the supervisor writes its exit
            leader = Leader(int(answer["pid"]), None, -1.0)
        limit = cmd.max_runtime_s
        self._jobs[cmd.job_id] = RunningJob(
            cmd.job_id, leader, Supervisor(process), cmd,
            runtime_deadline=None if limit is None else time.monotonic() + limit,
        )
        log.info(
            "job %d started: pid %d (supervisor %d), GPUs %s, as %s", cmd.job_id, leader.pid, process.pid,
            cmd.gpu_indices or "none", account.name if account else "the agent's user",
        )
        if cmd.duty_cycle < 1:
            self.set_duty_cycle(cmd.job_id, cmd.duty_cycle)
        return leader.pid

    def _start(self, cmd: LaunchJob, account: Account | None, work_dir: Path, code_archive: bytes | None,
               fence: JobFence = JobFence()):
        """Where the job starts, what the supervisor runs, with which environment, and how to
        remove its container afterwards: ``(start_dir, argv, env, cleanup)``."""
        if cmd.workdir is not None:
            start_dir = Path(cmd.workdir)
        elif cmd.code is not None:
            owner = (account.uid, account.gid) if account is not None else None
            try:
                start_dir = code.unpack(code_archive or b"", self.code_dir(cmd), owner)
            except code.CodeError as exc:
                raise LaunchError(f"code archive {cmd.code.sha256[:12]}: {exc}") from None
            except OSError as exc:
                raise LaunchError(f"cannot unpack the code archive into {self.code_dir(cmd)}: "
                                  f"{exc.strerror or exc}") from None
        else:
            start_dir = work_dir
        env = job_env(cmd, account, start_dir, fence, pass_env=self.pass_env, job_path=self.job_path,
                      isolation=self.isolation, preempt_file=self.preempt_file(cmd.job_id))
        notebook_idle_s = tunnel_protocol.notebook_idle_s(cmd.env)
        if notebook_idle_s is not None:  # a notebook server on loopback, reached through agents.tunnel
            try:
                argv = notebooks.launch(self.job_dir(cmd.job_id), cmd.job_id, notebook_idle_s, list(cmd.argv),
                                        cmd.image, env)
            except ValueError as exc:
                raise LaunchError(str(exc)) from None
            return start_dir, argv, env, None
        idle_s = session_idle_s(cmd.env)
        if idle_s is not None:  # an interactive session: the argv runs on a terminal (agents.sessions)
            if cmd.image is not None:
                raise LaunchError("interactive sessions do not run in container images yet; leave out the image")
            fifo = sessions.prepare_input(self.job_dir(cmd.job_id), account.gid if account else None)
            return start_dir, sessions.host_command(fifo, idle_s, list(cmd.argv)), env, None
        if cmd.image is None:
            return start_dir, list(cmd.argv), env, None
        try:
            wrapped = containers.wrap(
                self.container_runtime, cmd, env, start_dir=str(start_dir),
                read_only=(str(self.preempt_file(cmd.job_id).parent),), account=account,
            )
        except containers.ContainerRefused as exc:
            raise LaunchError(str(exc)) from None
        return start_dir, wrapped.argv, wrapped.env, wrapped.cleanup

    def stop(self, job_id: int, grace_seconds: float, *, requeue: bool = False, preempt: bool = False,
             error: str | None = None) -> None:
        """Send the launch's stop signal (SIGTERM unless it chose another) to the job's process
        group; :meth:`poll` sends SIGKILL once the grace is over.

        Unknown or already-finished jobs are ignored. A second stop never extends the deadline.
        ``requeue``: the node ends it for reasons of its own (the agent shutting down); its
        supervisor records an exit other than 0 as one to requeue. ``preempt``: first write the
        SIGKILL deadline to the job's ``COLONY_PREEMPT_FILE``, so it knows how long it has to
        checkpoint when the signal arrives. ``error``: why the node requeues it, reported with the exit.
        """
        job = self._jobs.get(job_id)
        if job is None:
            return
        deadline = time.monotonic() + max(0.0, grace_seconds)
        if job.kill_deadline is not None and job.kill_deadline <= deadline:
            return
        job.stopped = True
        job.kill_deadline = deadline
        kill_at = time.time() + max(0.0, grace_seconds)
        signum = stop_signal(job.command)
        log.info("job %d: %s (%s, grace %.1fs)", job_id, "preempting" if preempt else "stopping",
                 signum.name, grace_seconds)
        if preempt or self.preempt_file(job_id).exists():
            # A notice already given must not promise more time.
            write_preempt_notice(self.preempt_file(job_id), job_id, kill_at)
        # Recorded for the supervisor's exit.json and for an agent that adopts the job meanwhile.
        write_stop(self.job_dir(job_id), job_id, "shutdown" if requeue else "stop", error if requeue else None, kill_at)
        # No more slicing; a stopped (throttled or suspended) group only acts on the signal once
        # it is continued, so SIGCONT follows. SIGKILL needs no help.
        self._cycler.forget(job_id)
        self._signal_group(job, signal.SIGKILL if grace_seconds <= 0 else signum)
        self._signal_group(job, signal.SIGCONT)

    def kill_out_of_memory(self, job_id: int, error: str) -> None:
        """SIGKILL the job's group because its GPU ran out of memory; :meth:`poll` reports it
        with ``oom=True`` and ``error``. Unknown or already-killed jobs are ignored."""
        job = self._jobs.get(job_id)
        if job is None or job.killed:
            return
        log.warning("job %d: out of GPU memory; killing it: %s", job_id, error)
        job.oom_error = error
        write_stop(self.job_dir(job_id), job_id, "oom", error, time.time())
        self._cycler.forget(job_id)
        self._signal_group(job, signal.SIGKILL)

    # ------------------------------------------------------------------ throttling

    def set_duty_cycle(self, job_id: int, duty_cycle: float) -> bool:
        """Time-slice the job to ``duty_cycle`` of each period (1.0: unthrottled); False if unknown."""
        job = self._live(job_id)
        if job is None:
            return False
        self._cycler.set_duty_cycle(job_id, job.pid, duty_cycle)
        log.info("job %d: duty cycle %.2f", job_id, duty_cycle)
        return True

    def suspend(self, job_id: int) -> bool:
        """Stop the job's process group until :meth:`resume`; False if unknown."""
        job = self._live(job_id)
        if job is None:
            return False
        self._cycler.suspend(job_id, job.pid)
        log.info("job %d: suspended", job_id)
        return True

    def resume(self, job_id: int) -> bool:
        """Continue a suspended job under its previous duty cycle; False if unknown."""
        if self._live(job_id) is None:
            return False
        self._cycler.resume(job_id)
        log.info("job %d: resumed (duty cycle %.2f)", job_id, self._cycler.duty_cycle(job_id))
        return True

    def duty_cycle(self, job_id: int) -> float:
        """The job's current share of wall time: 0.0 while suspended, 1.0 when unthrottled."""
        return 0.0 if self._cycler.suspended(job_id) else self._cycler.duty_cycle(job_id)

    def _live(self, job_id: int) -> RunningJob | None:
        """A job that is running and not being ended or killed (so it may be throttled)."""
        job = self._jobs.get(job_id)
        if job is None or job.ending or job.killed or job.timing_out:
            return None
        return job

    def _cycler_signal(self, job_id: int, pgid: int, signum: int) -> None:
        """The duty cycler's signals (called with its lock held), checked against the leader."""
        job = self._jobs.get(job_id)
        if job is not None and job.pid == pgid:
            self._signal_group(job, signum)

    def running(self) -> set[int]:
        """Ids of jobs whose exit has not yet been returned by :meth:`poll`."""
        return set(self._jobs)

    def last_launches(self) -> list[LaunchJob]:
        """The newest launch this node took for each job it ran (``launch.json``, kept after the
        job ends): a new agent remembers them, so a launch re-sent or replayed after an agent
        restart does not run an attempt that already ran here."""
        launches = []
        for path in sorted((self.workdir / "jobs").glob(f"*/{LAUNCH_RECORD}")):
            try:
                launches.append(LaunchJob.model_validate_json(path.read_bytes()))
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable launch record (%s); ignored", path, exc)
        return launches

    def never_started(self, cmd: LaunchJob) -> bool:
        """Whether ``cmd`` was taken here (its launch record written) by an agent that died before
        its supervisor started the job: nothing of it ran, and nothing will report it. Either no
        supervisor was about to start (no spawn record), or one was but none holds the job
        directory's lock, none wrote the job's records and it is past the time a supervisor has
        to answer (the agent died before handing it the job, so it started nothing). An attempt
        that ran and ended is never taken for one that did not: its spawn record says it ended
        before its records go (:func:`agents.job_records.remove_records`)."""
        if cmd.job_id in self._jobs:
            return False
        job_dir = self.job_dir(cmd.job_id)
        taken = read_launch(job_dir)
        if taken is None or taken.command_id != cmd.command_id:
            return False
        if any((job_dir / name).exists() for name in (PROCESS_RECORD, EXIT_RECORD)):
            return False
        return not (job_dir / SPAWN_RECORD).exists() or spawn_abandoned(job_dir, cmd.command_id)

    def launch_of(self, job_id: int) -> LaunchJob | None:
        """The launch the job's running attempt came from; None when it does not run here."""
        job = self._jobs.get(job_id)
        return None if job is None else job.command

    def running_launches(self) -> dict[int, str]:
        """Job id -> the launch (attempt) each running job came from."""
        return {job_id: job.command.command_id for job_id, job in list(self._jobs.items())}

    def processes(self) -> dict[int, JobProcesses]:
        """What a GPU backend needs to know about each running job, in launch order."""
        return {
            job.job_id: JobProcesses(
                job_id=job.job_id,
                pid=job.pid,
                gpu_indices=tuple(job.command.gpu_indices),
                env=dict(job.command.env),
                gpu_memory_limit_mib=job.command.gpu_memory_limit_mib,
                duty_cycle=self.duty_cycle(job.job_id),
            )
            for job in self._jobs.values()
        }

    def poll(self) -> list[FinishedJob]:
        """Escalate overdue stops, stop throttling jobs past their runtime limit (their
        supervisor ends them), and return the jobs that finished since the last call."""
        now = time.monotonic()
        self._exiting = [process for process in self._exiting if process.poll() is None]
        self.isolation.retry_releases()  # cgroups of jobs whose supervisor was still on its way out
        finished = []
        for job in list(self._jobs.values()):
            if job.kill_deadline is not None and now >= job.kill_deadline and not job.killed:
                log.warning("job %d: still running after its grace period; killing it", job.job_id)
                self._signal_group(job, signal.SIGKILL)
            if job.timing_out:
                self._cycler.forget(job.job_id)  # it must run to act on the supervisor's SIGTERM
            result = supervise.read_json(self.job_dir(job.job_id) / EXIT_RECORD)
            if result is None:
                if job.supervisor.alive():
                    continue
                # It may have written its exit just before it exited.
                result = supervise.read_json(self.job_dir(job.job_id) / EXIT_RECORD)
            if result is None:
                log.error("job %d: its supervisor (pid %d) died; killing the job's processes",
                          job.job_id, job.supervisor.pid)
            # Forgotten before anything else: no duty-cycle signal once the job is reported.
            self._cycler.forget(job.job_id)
            if result is None:
                self._signal_group(job, signal.SIGKILL)
            finished.append(self._finished(job, result, keep_records=result is not None))
            del self._jobs[job.job_id]
            job.leader.close()
            if job.supervisor.process is not None and job.supervisor.process.poll() is None:
                self._exiting.append(job.supervisor.process)  # exits right after writing exit.json
        return finished

    def _finished(self, job: RunningJob, result: dict | None, keep_records: bool) -> FinishedJob:
        """The job's exit from its supervisor's ``result`` (None: the supervisor died). Its records
        stay until :meth:`release_reported` when ``keep_records``, else they are removed now."""
        job_dir = self.job_dir(job.job_id)
        self.isolation.release(job.job_id)
        if keep_records:
            self._reported[job.job_id] = job.command.command_id
        else:
            remove_records(job_dir)
        if result is None:
            done = FinishedJob(
                job_id=job.job_id, exit_code=None, stopped=job.stopped, requeue=not job.stopped,
                finished_at=time.time(), launch_id=job.command.command_id,
                output_tail=read_tail(job_dir / "output.log"),
                error="the job's supervisor process died; the job's processes were killed",
                gpu_indices=tuple(job.command.gpu_indices), gpu_memory_limit_mib=job.command.gpu_memory_limit_mib,
            )
        else:
            exit_code = result.get("exit_code")
            oom = job.oom_error is not None or bool(result.get("oom"))
            requeue = bool(result.get("requeue"))
            done = FinishedJob(
                job_id=job.job_id,
                exit_code=exit_code if isinstance(exit_code, int) else None,
                stopped=job.stopped or bool(result.get("stopped")),
                output_tail=read_tail(job_dir / "output.log"),
                finished_at=float(result.get("finished_at") or time.time()),
                oom=oom,
                error=job.oom_error or (result.get("error") if oom or requeue else None),
                launch_id=job.command.command_id,
                timed_out=bool(result.get("timed_out")),
                requeue=requeue,
                gpu_indices=tuple(job.command.gpu_indices), gpu_memory_limit_mib=job.command.gpu_memory_limit_mib,
            )
        log.info("job %d exited with %s%s%s", job.job_id, done.exit_code,
                 " (stopped)" if done.stopped else " (out of memory)" if done.oom
                 else " (timed out)" if done.timed_out else "",
                 " (adopted from an earlier agent)" if job.adopted else "")
        return done

    def release_reported(self, pending: set[tuple[int, str | None]]) -> None:
        """Remove the records of exits :meth:`poll` or :meth:`recover` returned, except those
        whose ``(job_id, launch_id)`` is in ``pending`` (their event is not yet with the control
        plane). Until then an agent killed meanwhile leaves them to the next one, which reports
        them again (the control plane ignores an exit it already has)."""
        for job_id, launch_id in list(self._reported.items()):
            if (job_id, launch_id) in pending:
                continue
            del self._reported[job_id]
            if job_id in self._jobs:
                continue  # launched again meanwhile: the records are the new attempt's
            job_dir = self.job_dir(job_id)
            record = supervise.read_json(job_dir / PROCESS_RECORD)
            if record is None or record.get("launch_id") == launch_id:
                remove_records(job_dir)

    def stop_all(self, grace_seconds: float, give_up_after: float = 10.0, *,
                 requeue: bool = False) -> list[FinishedJob]:
        """Stop every job and wait until all have exited (SIGKILL after the grace).

        Returns their exits. Gives up ``give_up_after`` seconds past the grace on processes that
        even SIGKILL does not end (uninterruptible I/O), leaving them listed as running.
        ``requeue``: see :meth:`stop`.
        """
        for job_id in list(self._jobs):
            self.stop(job_id, grace_seconds, requeue=requeue)
        finished = self.poll()
        deadline = time.monotonic() + grace_seconds + give_up_after
        while self._jobs and time.monotonic() < deadline:
            time.sleep(0.02)
            finished.extend(self.poll())
        if self._jobs:
            log.error("jobs %s did not exit after SIGKILL", sorted(self._jobs))
        return finished

    # ------------------------------------------------------------------ jobs of an earlier agent

    def _record_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / PROCESS_RECORD

    def recover(self, grace_seconds: float) -> list[FinishedJob]:
        """Take over what an earlier agent on this workdir left: call once, before registering.

        A job whose supervisor and leader still run is adopted (listed by :meth:`running`,
        throttled, stopped and reported by :meth:`poll` like any other); a job that ended while
        no agent ran is returned with the exit its supervisor recorded; processes nobody
        supervises any more are stopped and returned for a requeue
        (:func:`agents.job_adoption.stop_unsupervised`).
        """
        finished: list[FinishedJob] = []
        for path in sorted((self.workdir / "jobs").glob(f"*/{PROCESS_RECORD}")):
            job_id = int(path.parent.name) if path.parent.name.isdigit() else None
            if job_id is None or job_id in self._jobs or job_id in self._reported:
                continue
            ended = self._adopt(job_id, path)
            if ended is not None:
                finished.append(ended)
        return finished + self._stop_unsupervised(grace_seconds)

    def _adopt(self, job_id: int, path: Path) -> FinishedJob | None:
        """Take over the job whose supervisor wrote ``path`` (its ``process.json``): adopted while
        it runs; its exit, as its supervisor recorded it, when it ended; left to
        :meth:`_stop_unsupervised` when nobody supervises it any more."""
        taken = take_over(job_id, path)
        if taken is None:
            return None
        job, result = taken
        if result is not None:
            log.info("job %d ended while no agent ran (or its exit was not yet sent); reporting it", job_id)
            job.leader.close()
            return self._finished(job, result, keep_records=True)
        self._jobs[job_id] = job
        self.isolation.adopt(job.command)
        self.isolation.freeze(job_id, False)  # as take_over's SIGCONT: a duty cycle may have left it frozen
        log.info("job %d: adopted from an earlier agent (pid %d, supervisor %d)", job_id, job.pid, job.supervisor.pid)
        if job.command.duty_cycle < 1:
            self.set_duty_cycle(job_id, job.command.duty_cycle)
        return None

    def _stop_unsupervised(self, grace_seconds: float) -> list[FinishedJob]:
        return stop_unsupervised(self.workdir / "jobs", set(self._jobs) | set(self._reported), grace_seconds)

    def adopt_late(self, job_id: int, launch_id: str | None, grace_seconds: float) -> list[FinishedJob]:
        """Take over the attempt ``launch_id`` of ``job_id`` (None: the one its record names) now,
        as :meth:`recover` would have, if an earlier agent spawned its supervisor and recover() ran
        before that supervisor wrote its record (it starts a fresh interpreter first: a fraction
        of a second, which an agent that systemd restarts at once can fall into). Nothing else
        would ever report that attempt, and a node that says it does not know it gets it run a
        second time elsewhere. Called when the control plane asks after or stops the attempt (a
        re-sent launch, a query, a stop). Returns its exit if it ended, or its stop for a requeue
        if nobody supervises it any more."""
        if job_id in self._jobs or job_id in self._reported:
            return []
        path = self._record_path(job_id)
        record = supervise.read_json(path)
        if record is None or launch_id not in (None, record.get("launch_id")):
            return []
        ended = self._adopt(job_id, path)
        if ended is not None:
            return [ended]
        if job_id in self._jobs:
            return []
        return self._stop_unsupervised(grace_seconds)  # (its supervisor is gone too)

    def stop_orphans(self, grace_seconds: float) -> list[FinishedJob]:
        """The name :meth:`recover` had before jobs had supervisors (it only stopped orphans)."""
        return self.recover(grace_seconds)

    def close(self) -> None:
        """End the duty-cycle thread, continuing anything it holds stopped. Idempotent. Jobs
        still running keep running under their supervisors (an agent that adopts them takes over)."""
        self._cycler.close()
        for process in self._exiting:
            reap(process, 2.0)
        self._exiting = []

    def _signal_group(self, job: RunningJob, signum: int) -> None:
        """Signal the job's process group; a stop or continue also freezes or thaws its cgroup,
        so what left the group (``setsid()``) stops and continues with it."""
        if signum == signal.SIGKILL:
            job.killed = True
        if signum == signal.SIGCONT:
            self.isolation.freeze(job.job_id, False)
        job.leader.signal_group(signum, job.job_id)
        if signum == signal.SIGSTOP:
            self.isolation.freeze(job.job_id, True)
