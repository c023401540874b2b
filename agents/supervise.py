"""The per-job supervisor: one small process per job that owns it, so the job outlives its agent.

It plays the part of Slurm's ``slurmstepd`` or containerd's shim. :class:`agents.runner.JobRunner`
starts it in a fresh interpreter (:func:`command`), in a session of its own (so neither the agent's
death, a ``killpg`` of the agent's process group nor a terminal's Ctrl-C reaches it; it sets no
parent-death signal), and writes the job's spec to its stdin as JSON. The supervisor then

0. with a ``cgroup`` in the spec (every job, on a node where the agent can make cgroups, see
   :mod:`agents.isolation.cgroups`), has the job join it between fork and exec, so the job is born
   there, inside its device fence and limits, before it can open a GPU; the supervisor itself
   stays outside, so that it survives killing the cgroup;
1. starts the job's argv as the leader of its own session and process group, under the account the
   spec names: between fork and exec the child joins the cgroup (as root), drops to the account's
   supplementary groups, gid and uid, and only then enters the job's working directory, so a job
   cannot start (and read) where its account may not go ("account X cannot enter DIR: Permission
   denied" is the launch error); with the spec's environment and nothing of its own;
2. copies the job's output through a pipe into the size-bounded ``output.log``
   (:class:`agents.joblog.BoundedLog`), which is why the job need not die with the agent;
3. writes ``process.json`` (the leader's pid and start time, its own pid and start time, the launch
   id and the runtime limit) and answers the runner on stdout with ``{"pid": ..., "create_time": ...}``
   (or ``{"error": ...}`` when the job cannot start), then closes stdout;
4. ends the job if it runs past ``max_runtime_s`` (wall clock from its start, suspended time
   included): the launch's stop signal (SIGTERM unless it chose another) and SIGCONT to its
   group, SIGKILL after ``stop_grace_s``;
5. once the leader exits, SIGKILLs what is left of its group (the leader, not yet reaped, still
   holds the group id, so nothing else can be hit) and kills its whole cgroup (``cgroup.kill``:
   the daemons it started with ``setsid`` or a double fork die with it), waits for the cgroup to
   empty and removes it, reaps the leader, removes the job's container if the
   leader was a container runtime's client that did not end cleanly (``container_cleanup``: a
   killed docker or podman client leaves its container running), drains the log, writes ``exit.json``
   atomically (``exit_code``, ``finished_at``, ``timed_out``, and ``stopped``/``oom``/``requeue``/
   ``error`` from the agent's ``stop.json`` when it asked for the end) and exits.

Stop, throttling and suspension stay with the agent, which signals the job's process group itself
after checking that the leader recorded in ``process.json`` is still the same, unreaped process.

Nothing here imports Redis, the protocol or pydantic: the supervisor must start fast.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from agents.joblog import BoundedLog

try:
    from agents.hardening import make_non_dumpable
except ImportError:  # pragma: no cover - an older tree without it
    def make_non_dumpable() -> bool:
        return False

log = logging.getLogger("agents.supervise")

PROCESS_RECORD = "process.json"
# Held by the job's supervisor for its whole life (``lock_held``).
SUPERVISOR_LOCK = "supervisor.lock"
LOCK_WAIT_SECONDS = 5.0
EXIT_RECORD = "exit.json"
STOP_RECORD = "stop.json"
SUPERVISOR_LOG = "supervisor.log"
# How long removing a job's container (``docker rm -f``) may take before the exit is written anyway.
CONTAINER_CLEANUP_SECONDS = 30.0
# How long a finished job's output may take to drain from the pipe before the log is closed
# (only a process that escaped the job's group keeps the pipe open that long).
OUTPUT_DRAIN_SECONDS = 1.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
# -I: no PYTHON* variables, no user site, no current directory on sys.path; only this package's root.
_BOOT = f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from agents.supervise import main; sys.exit(main())"


def command() -> list[str]:
    """argv that starts a supervisor (its spec goes to its stdin)."""
    return [sys.executable, "-I", "-c", _BOOT]


def write_json_atomically(path: Path, data: dict, mode: int = 0o640) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, json.dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None if it is missing or not a readable object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        log.error("cannot signal process group %d: %s", pgid, exc)


def _has_exited(pid: int) -> bool:
    """Whether the leader has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class _Answer:
    """The runner's end of our stdout: one JSON line, then closed."""

    def send(self, data: dict) -> None:
        try:
            os.write(1, (json.dumps(data) + "\n").encode())
        except OSError:
            pass  # the agent is gone; the job's files say everything
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def supervise(spec: dict) -> int:
    job_dir = Path(spec["job_dir"])
    answer = _Answer()
    cgroup = Path(spec["cgroup"]) if spec.get("cgroup") else None
    if cgroup is not None and not (cgroup / "cgroup.procs").is_file():
        answer.send({"error": f"the job's cgroup {cgroup} is gone; the job was not started unfenced"})
        return 0
    try:
        output, write_fd = BoundedLog.open(
            Path(spec["log_path"]), int(spec["max_log_bytes"]), group=spec.get("log_group"),
            name=f"job-{spec['job_id']}-output",
        )
    except OSError as exc:
        answer.send({"error": f"cannot create the job's log: {exc.strerror or exc}"})
        return 0
    identity = {}
    if spec.get("user") is not None:
        identity = {"user": spec["user"], "group": spec["group"], "extra_groups": list(spec["extra_groups"])}
    argv = spec["argv"]
    refusal_read, refusal_write = os.pipe()  # (close-on-exec: EOF once the job's exec succeeded)
    try:
        process = subprocess.Popen(
            argv, env=spec["env"], stdin=subprocess.DEVNULL, stdout=write_fd, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
            preexec_fn=_JobEntry(cgroup, identity, spec["cwd"], refusal_write),
        )
    except (OSError, subprocess.SubprocessError) as exc:  # missing executable, bad interpreter ...
        output.finish(0)
        os.close(refusal_write)
        refusal = _read_refusal(refusal_read)
        if refusal is not None:
            answer.send({"error": _refusal_message(refusal, spec, cgroup)})
        else:
            answer.send({"error": f"cannot start {argv[0]!r}: {getattr(exc, 'strerror', None) or exc}"})
        return 0
    except ValueError as exc:  # e.g. a NUL byte in argv or env
        output.finish(0)
        os.close(refusal_write)
        os.close(refusal_read)
        answer.send({"error": f"cannot start {argv[0]!r}: {exc}"})
        return 0
    finally:
        os.close(write_fd)  # the child holds its own copy; the pump sees EOF once it is gone
    os.close(refusal_write)
    os.close(refusal_read)
    started = time.monotonic()
    started_at = time.time()
    output.start()
    try:
        create_time = psutil.Process(process.pid).create_time()
    except psutil.Error:
        create_time = None  # already gone (and not yet reaped: it is our child)
    me = psutil.Process()
    record = {
        "pid": process.pid, "create_time": create_time, "launch_id": spec.get("launch_id"),
        "supervisor_pid": me.pid, "supervisor_create_time": me.create_time(), "started_at": started_at,
        "max_runtime_s": spec.get("max_runtime_s"), "stop_grace_s": spec.get("stop_grace_s"),
    }
    try:
        write_json_atomically(job_dir / PROCESS_RECORD, record)
    except OSError as exc:  # a full disk costs adoption by a later agent, never the job
        log.warning("cannot write %s: %s", job_dir / PROCESS_RECORD, exc)
    answer.send({"pid": process.pid, "create_time": create_time})

    stop_signal = int(spec.get("stop_signal") or signal.SIGTERM)
    timed_out = _wait(process, started, spec.get("max_runtime_s"), float(spec.get("stop_grace_s") or 0.0),
                      stop_signal)
    # The leader is a zombie until reaped, so its pid (== the group id) cannot be reused yet:
    # this reaches only the job's stragglers.
    _signal_group(process.pid, signal.SIGKILL)
    if cgroup is not None:
        if kill_cgroup(cgroup):
            _remove_cgroup(cgroup)  # (the agent does it otherwise; an agent that died cannot)
        else:
            log.warning("processes of the job are still in %s after it was killed", cgroup)
    exit_code = process.wait()
    if spec.get("container_cleanup") and exit_code != 0:
        _remove_container(spec["container_cleanup"], spec["env"], identity)
    output.finish(OUTPUT_DRAIN_SECONDS)
    stop = read_json(job_dir / STOP_RECORD) or {}
    result = {
        "job_id": spec["job_id"], "launch_id": spec.get("launch_id"), "exit_code": exit_code,
        "finished_at": time.time(), "started_at": started_at, "timed_out": timed_out,
        "stopped": stop.get("reason") in ("stop", "shutdown"), "oom": stop.get("reason") == "oom",
        "error": stop.get("error"),
        # Ended by its agent shutting down: not the job's doing, so it runs again (unless it was
        # done anyway).
        "requeue": stop.get("reason") == "shutdown" and exit_code != 0 and not timed_out,
    }
    write_json_atomically(job_dir / EXIT_RECORD, result)
    log.info("job %s exited with %s%s", spec["job_id"], exit_code, " (timed out)" if timed_out else "")
    return 0


class _JobEntry:
    """What the job's child does between fork and exec (``preexec_fn``; the supervisor has no
    thread yet): join the job's cgroup while still privileged, drop to the job's account, then
    enter the working directory as that account. A refusal is written to ``refusal_fd`` as
    JSON before raising, since Popen reports only that the step failed."""

    def __init__(self, cgroup: Path | None, identity: dict, cwd: str, refusal_fd: int):
        self.cgroup, self.identity, self.cwd, self.refusal_fd = cgroup, identity, cwd, refusal_fd

    def __call__(self) -> None:
        step = "cgroup"
        try:
            if self.cgroup is not None:
                _write_file(self.cgroup / "cgroup.procs", str(os.getpid()))
            step = "account"
            if self.identity:
                os.setgroups(self.identity["extra_groups"])
                os.setresgid(self.identity["group"], self.identity["group"], self.identity["group"])
                os.setresuid(self.identity["user"], self.identity["user"], self.identity["user"])
            step = "cwd"
            os.chdir(self.cwd)
        except OSError as exc:
            os.write(self.refusal_fd, json.dumps({"step": step, "error": exc.strerror or str(exc)}).encode())
            raise


def _read_refusal(fd: int) -> dict | None:
    try:
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        refusal = json.loads(data) if data else None
    except ValueError:
        return None
    return refusal if isinstance(refusal, dict) else None


def _refusal_message(refusal: dict, spec: dict, cgroup: Path | None) -> str:
    why = refusal.get("error")
    if refusal.get("step") == "cgroup":
        return f"cannot join the job's cgroup {cgroup}: {why}; the job was not started unfenced"
    if refusal.get("step") == "account":
        return f"cannot switch to the job's account (uid {spec.get('user')}): {why}"
    return f"{_account_name(spec.get('user'))} cannot enter {spec['cwd']}: {why}"


def _account_name(uid: int | None) -> str:
    if uid is None:
        uid = os.getuid()
    import pwd  # only on this error path: a lookup may go to LDAP

    try:
        return f"account {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"account uid {uid}"


def _write_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())  # one write: the kernel takes one pid per write to cgroup.procs
    finally:
        os.close(fd)


def _cgroup_populated(cgroup: Path) -> bool:
    try:
        for line in (cgroup / "cgroup.events").read_text().splitlines():
            if line.startswith("populated "):
                return line.split()[1] != "0"
    except OSError:
        pass
    try:  # (no cgroup.events: a plain directory standing in for a cgroup)
        pids = [int(word) for word in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return False  # gone
    return any(_live(pid) for pid in pids)


def _live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _remove_cgroup(cgroup: Path) -> None:
    try:
        os.rmdir(cgroup)
    except OSError:
        pass  # a test's plain directory, or the agent was first


def kill_cgroup(cgroup: Path, wait: float = 10.0) -> bool:
    """SIGKILL every process in ``cgroup`` (``cgroup.kill``; before Linux 5.14, each pid in
    ``cgroup.procs`` until none is left); True once it is empty, within ``wait`` seconds."""
    try:
        _write_file(cgroup / "cgroup.kill", "1")
        one_shot = True
    except FileNotFoundError:
        one_shot = False
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # (EINVAL: not a cgroup that has it, e.g. a test's plain directory)
            log.warning("cannot write %s: %s", cgroup / "cgroup.kill", exc.strerror or exc)
        one_shot = False
    deadline = time.monotonic() + wait
    while True:
        if not one_shot:
            try:
                pids = [int(word) for word in (cgroup / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if not _cgroup_populated(cgroup):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _remove_container(argv: list[str], env: dict, identity: dict) -> None:
    """Best effort, as the job's account (a rootless runtime keeps the container in its store);
    a container already gone (``--rm``) makes the runtime complain, which is fine."""
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=CONTAINER_CLEANUP_SECONDS, close_fds=True,
                              **identity)
        log.info("removed the job's container: %s exited %d %s", argv[1:], done.returncode,
                 done.stderr.decode("utf-8", "replace").strip()[:200])
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("could not remove the job's container (%s): %s", " ".join(argv[1:]), exc)


def _wait(process: subprocess.Popen, started: float, max_runtime_s, grace: float,
          stop_signal: int = signal.SIGTERM) -> bool:
    """Wait until the leader exits, ending it past its runtime limit; True if it timed out."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (OSError, AttributeError):
        pidfd = None  # an old kernel: poll instead
    deadline = started + max_runtime_s if max_runtime_s else None
    kill_at: float | None = None
    timed_out = killed = False
    try:
        while not _has_exited(process.pid):
            now = time.monotonic()
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                log.warning("job ran past its limit of %ss; ending it (grace %.1fs)", max_runtime_s, grace)
                _signal_group(process.pid, stop_signal if grace > 0 else signal.SIGKILL)
                _signal_group(process.pid, signal.SIGCONT)  # a throttled or suspended group must see it
                kill_at = now + grace
            if kill_at is not None and now >= kill_at and not killed:
                killed = True
                log.warning("job still running %.1fs after its stop signal; killing it", grace)
                _signal_group(process.pid, signal.SIGKILL)
            edges = [t for t in (None if timed_out else deadline, None if killed else kill_at) if t is not None]
            timeout = max(0.0, min([now + 5.0, *edges]) - now)
            if pidfd is not None:
                select.select([pidfd], [], [], timeout)
            else:
                time.sleep(min(timeout, 0.05))
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return timed_out


def make_lock(job_dir: Path) -> None:
    """Create the job directory's supervisor lock (empty), for the supervisor about to start."""
    os.close(os.open(job_dir / SUPERVISOR_LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def lock_held(job_dir: Path) -> bool:
    """Whether a supervisor holds the job directory's lock, i.e. runs (a lock dies with its holder;
    unlike a process's working directory, which a non-dumpable process keeps from its own agent
    without CAP_SYS_PTRACE, it can be tested by anyone who can open the file). True when that
    cannot be told (no lock file: a supervisor from before there was one)."""
    try:
        fd = os.open(job_dir / SUPERVISOR_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (and with it the lock, if this took it)
    return False


def _hold_lock() -> int | None:
    """Take the supervisor lock of the job directory this runs in (its working directory), and keep
    it for as long as this process lives. Waits a little for a supervisor of the job's last
    attempt, which exits right after recording its exit."""
    try:
        fd = os.open(SUPERVISOR_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # (made by an agent from before there was one)
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                log.warning("the supervisor lock is held by another process; going on without it")
                os.close(fd)
                return None
            time.sleep(0.05)


def main() -> int:
    make_non_dumpable()  # it holds the job's environment: no other process of its uid may read it
    _hold_lock()  # (first: until then, an agent may take this spawn for one that never happened)
    # No signal is ignored here: an ignored signal would stay ignored in the job across exec. An
    # agent started in the background (nohup, `cmd &` in a script) passes SIGINT/SIGHUP ignored to
    # us; set them back so the job can be stopped with SIGINT like any program. In a session of its
    # own, with no terminal, no Ctrl-C or hang-up reaches the supervisor anyway.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(process)d %(levelname)s: %(message)s")
    spec = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        return supervise(spec)
    except Exception:
        log.exception("supervisor of job %s failed", spec.get("job_id"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
