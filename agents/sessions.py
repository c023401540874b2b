"""Interactive sessions on the node (``colony shell``): a job's process on a pseudo-terminal, and
the relay between that terminal and the control plane. No open port on the node: everything
travels through Redis, the way commands and output already do.

Two halves, in two processes:

- the **terminal host** (:func:`host_main`) is what the job's supervisor starts instead of the
  job's argv (:func:`host_command`), so it runs inside the job's sandbox (cgroup, account,
  environment, GPUs) like any batch job. It opens a pseudo-terminal, starts the argv on it (the
  session's shell), copies what the terminal prints to its stdout (the supervisor's pipe into
  ``output.log``, so the output is kept as a batch job's is) and what arrives on the job's input
  FIFO (``session.in`` in the job directory, written by the agent alone) into the terminal. It
  ends the shell after ``--idle`` seconds without input, and when the supervisor stops the job;
  its exit is the shell's.
- the **relay** (:class:`SessionRelay`), a thread of the agent: it reads the node's session input
  stream (:func:`agents.protocol.session_input_stream`), keeps only entries the control plane
  MACed for this node (:func:`sign_input`, a domain apart from commands and events) and for an
  attempt this node runs on a terminal, and writes them to that job's FIFO as frames; and it ships
  each session's new ``output.log`` bytes, signed, to the job's own output stream
  (:func:`agents.protocol.session_output_stream`) every ``POLL_S``, so keystrokes echo in well
  under a second instead of the batch output's interval.

What must not live here: the job's sandbox (:mod:`agents.runner`), the command stream
(:mod:`agents.command_intake`), message shapes (:mod:`agents.protocol`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import errno
import fcntl
import logging
import os
import pty
import select
import signal
import struct
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis

from agents import protocol, signing
from agents.domain_mac import DomainMac
from agents.job_output import read_output

log = logging.getLogger(__name__)

INPUT_FIFO = "session.in"
# Frames on the FIFO: a kind byte, then for data a 2-byte length and the bytes, for a resize rows
# and cols (2 bytes each). A frame never exceeds PIPE_BUF, so a non-blocking write of it is whole
# or nothing: the agent never leaves half a frame in the pipe.
FRAME_DATA, FRAME_RESIZE = b"D", b"R"
FRAME_MAX = 4096
_DATA_MAX = FRAME_MAX - 3
# Input held for a job whose terminal is not reading yet (starting, or busy): past this, dropped.
PENDING_MAX = 64 * 1024
POLL_S = 0.05
INPUT_LOOKBACK_MS = 10_000
SESSION_STREAM_MAXLEN = 1000  # output entries kept per session (about 16 MiB at most)
# A session's output stream outlives its last write (and the control plane's last read) by a day:
# set on every write, so one nobody ever attached to goes too.
OUTPUT_KEPT_S = 86400
OUTPUT_LAG_BYTES = 256 * 1024  # further behind than this, a session's output skips to its newest
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
HANGUP_GRACE_S = 5.0  # after SIGHUP, how long the shell has before SIGKILL
_SESSION_CONTEXT = b"colony-session:"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
_BOOT = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from agents.sessions import host_main; "
         "sys.exit(host_main(sys.argv[1:]))")


# ---------------------------------------------------------------- the MAC of session input


# A session input's ``m``, MACed by the node's key in a domain of its own: neither a command nor
# an agent's event can pass as keystrokes, nor keystrokes as either.
_INPUT_MAC = DomainMac(_SESSION_CONTEXT)
sign_input, verify_input, signed_input = _INPUT_MAC.sign, _INPUT_MAC.verify, _INPUT_MAC.signed


# ---------------------------------------------------------------- frames on the FIFO


def frames(data: bytes = b"", rows: int | None = None, cols: int | None = None) -> list[bytes]:
    """The FIFO frames for typed ``data`` and a window size (sent first: a full-screen program
    draws for the new size before the keys reach it)."""
    out = []
    if rows and cols:
        out.append(FRAME_RESIZE + struct.pack(">HH", min(rows, 0xFFFF), min(cols, 0xFFFF)))
    for start in range(0, len(data), _DATA_MAX):
        piece = data[start:start + _DATA_MAX]
        out.append(FRAME_DATA + struct.pack(">H", len(piece)) + piece)
    return out


class FrameReader:
    """Frames out of a byte stream that may split them anywhere. Anything that is not a frame
    (the job itself may write to its own FIFO) empties the buffer and is dropped, never raised."""

    def __init__(self):
        self._buffer = b""
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[tuple[bytes, object]]:
        self._buffer += chunk
        out: list[tuple[bytes, object]] = []
        while self._buffer:
            kind = self._buffer[:1]
            if kind == FRAME_DATA:
                if len(self._buffer) < 3:
                    break
                (length,) = struct.unpack(">H", self._buffer[1:3])
                if length > _DATA_MAX:
                    self._garbage()
                    break
                if len(self._buffer) < 3 + length:
                    break
                out.append((FRAME_DATA, self._buffer[3:3 + length]))
                self._buffer = self._buffer[3 + length:]
            elif kind == FRAME_RESIZE:
                if len(self._buffer) < 5:
                    break
                out.append((FRAME_RESIZE, struct.unpack(">HH", self._buffer[1:5])))
                self._buffer = self._buffer[5:]
            else:
                self._garbage()
                break
        return out

    def _garbage(self) -> None:
        self.dropped += len(self._buffer)
        self._buffer = b""


# ---------------------------------------------------------------- the terminal host (in the job)


def prepare_input(job_dir: Path, gid: int | None) -> Path:
    """Make the job's input FIFO afresh (an earlier attempt's may hold old keystrokes): the agent
    owns it; the job's group may open it (the host opens it read-write, so that it never sees an
    end of file while the agent has it closed)."""
    fifo = job_dir / INPUT_FIFO
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo, 0o600)
    if gid is not None:
        os.chown(fifo, -1, gid, follow_symlinks=False)
        os.chmod(fifo, 0o660)
    return fifo


def host_command(fifo: Path, idle_s: int, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` on a terminal fed from ``fifo``, ended after ``idle_s`` without input.
    -I: nothing of the job's PYTHON* variables or current directory reaches the host's imports."""
    return [sys.executable, "-I", "-c", _BOOT, "--input", str(fifo), "--idle", str(int(idle_s)), "--", *argv]


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue


def host_main(argv: list[str] | None = None) -> int:
    """Run the session's command on a pseudo-terminal until it exits; return its exit code."""
    parser = argparse.ArgumentParser(prog="colony-session")
    parser.add_argument("--input", required=True)
    parser.add_argument("--idle", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    fifo = os.open(args.input, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    stop = []
    for signum in STOP_SIGNALS:  # the shell has a session of its own: the job's stop must be passed on
        signal.signal(signum, lambda number, _frame: stop.append(number))
    pid, master = pty.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"colony: cannot run {command[0]}: {exc.strerror}\r\n".encode())
        os._exit(127)
    _set_size(master, 24, 80)  # until the user's terminal says its size
    os.set_blocking(master, False)
    return _serve(pid, master, fifo, args.idle, stop)


def _serve(pid: int, master: int, fifo: int, idle_s: int, stop: list) -> int:
    reader, pending = FrameReader(), bytearray()
    last_input = time.monotonic()
    kill_at: float | None = None
    status: int | None = None
    while True:
        if status is None:
            done, status_now = os.waitpid(pid, os.WNOHANG)
            status = status_now if done else None
        now = time.monotonic()
        if kill_at is None and (stop or now - last_input > idle_s):
            why = (f"no input for {idle_s} s: the session ends" if not stop
                   else "the job was stopped: the session ends")
            _write_all(1, f"\r\n[colony] {why}\r\n".encode())
            _hang_up(pid, master)
            kill_at = now + HANGUP_GRACE_S
        elif kill_at is not None and now >= kill_at and status is None:
            _signal_session(pid, master, signal.SIGKILL)
        try:
            ready, _, _ = select.select([master, fifo], [master] if pending else [], [],
                                               0.05 if status is not None else 0.5)
        except InterruptedError:
            continue
        if master in ready:
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                data = None
            except OSError:  # EIO: the terminal's last process is gone
                data = b""
            if data == b"":
                break
            if data:
                _write_all(1, data)
        elif status is not None:
            break  # the shell ended and the terminal has nothing more to say
        if fifo in ready:
            try:
                chunk = os.read(fifo, 65536)
            except BlockingIOError:
                chunk = b""
            for kind, payload in reader.feed(chunk):
                last_input = time.monotonic()
                if kind == FRAME_DATA:
                    pending += payload[: max(0, PENDING_MAX - len(pending))]
                else:
                    _set_size(master, *payload)
        if pending:
            try:
                del pending[:os.write(master, bytes(pending))]
            except BlockingIOError:
                pass
            except OSError:
                pending.clear()
    if status is None:
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _signal_session(pid: int, master: int, signum: int) -> None:
    """``signum`` to the shell's process group and to the terminal's foreground job."""
    groups = {pid}
    try:
        groups.add(os.tcgetpgrp(master))
    except OSError:
        pass
    for group in groups:
        try:
            os.killpg(group, signum)
        except OSError:
            pass


def _hang_up(pid: int, master: int) -> None:
    """As a closed terminal would: SIGHUP (an interactive shell ignores SIGTERM), then SIGCONT."""
    _signal_session(pid, master, signal.SIGHUP)
    _signal_session(pid, master, signal.SIGCONT)


# ---------------------------------------------------------------- the relay (in the agent)


def interactive_launches(runner) -> dict[int, str]:
    """Job id -> launch id of the running jobs that run on a terminal."""
    sessions = {}
    for job_id, launch_id in runner.running_launches().items():
        launch = runner.launch_of(job_id)
        if launch is not None and protocol.session_idle_s(launch.env) is not None:
            sessions[job_id] = launch_id
    return sessions


@dataclass
class _Session:
    job_id: int
    launch_id: str
    offset: int = 0
    anchor: bytes = b""
    fifo: int | None = None
    pending: bytes = b""
    ended: bool = False


class SessionRelay:
    """Keystrokes from the node's session input stream into each session's FIFO, and each session's
    output onto its own stream. ``track()`` is called by the agent loop; everything else runs on
    the relay's thread (:meth:`start`) or, in tests, through :meth:`step`."""

    def __init__(self, node: str, redis_url: str, key: bytes | None, job_dir: Callable[[int], Path]):
        self.node, self.redis_url, self._key, self._job_dir = node, redis_url, key, job_dir
        self._lock = threading.Lock()
        self._tracked: dict[int, str] = {}
        self._sessions: dict[int, _Session] = {}
        self._after: str | None = None  # the last input entry read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refused = 0  # input entries refused (malformed, unsigned, another node's, no such session)
        self.relayed_bytes = 0
        self.shipped_bytes = 0
        self._warned: set[str] = set()

    def track(self, launches: dict[int, str]) -> None:
        """The interactive jobs running now (job id -> launch id), from the agent loop."""
        with self._lock:
            self._tracked = dict(launches)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="session-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for session in self._sessions.values():
            self._close_fifo(session)

    def _run(self) -> None:
        client, backoff = None, 0.2
        while not self._stop.is_set():
            try:
                if not self._busy():
                    # No session here: no Redis round trips at all (a thousand idle nodes polling
                    # an empty stream 20 times a second would be Redis's busiest clients).
                    self._stop.wait(4 * POLL_S)
                    continue
                if client is None:
                    client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2.0, socket_timeout=5.0,
                                                  protocol=2)
                self.step(client, block_ms=int(POLL_S * 1000))
                backoff = 0.2
            except redis.RedisError as exc:
                self._warn_once("redis", f"session relay: Redis unavailable ({exc}); retrying")
                if client is not None:
                    client.close()
                client = None
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
            except Exception:  # a bug here must never take the agent (or its batch jobs) down
                log.exception("session relay: unexpected error; carrying on")
                self._stop.wait(1.0)
        if client is not None:
            client.close()

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._tracked or self._sessions)

    def step(self, client, block_ms: int = 0) -> None:
        """One round: follow the tracked set, relay input (waiting up to ``block_ms`` for it),
        ship output."""
        self._follow()
        self._relay_input(client, block_ms)
        self._ship_output(client)

    def _follow(self) -> None:
        with self._lock:
            tracked = dict(self._tracked)
        for job_id, launch_id in tracked.items():
            session = self._sessions.get(job_id)
            if session is None or session.launch_id != launch_id:
                if session is not None:
                    self._close_fifo(session)
                self._sessions[job_id] = _Session(job_id, launch_id)
        for job_id, session in self._sessions.items():
            if job_id not in tracked:
                session.ended = True  # shipped once more, then an end of file

    # ------------------------------------------------------------------ input

    def _relay_input(self, client, block_ms: int) -> None:
        stream = protocol.session_input_stream(self.node)
        if self._after is None:
            # From a little before now (Redis's clock): the first keystrokes of a session may be
            # sent as it starts, before this agent tracked it; older ones (an earlier agent's) are
            # stale, and any of another attempt is refused by its launch id anyway.
            seconds, micros = client.time()
            self._after = f"{max(0, seconds * 1000 + micros // 1000 - INPUT_LOOKBACK_MS)}-0"
        answer = client.xread({stream: self._after}, count=64, block=block_ms or None)
        for _name, entries in answer or []:
            for entry_id, fields in entries:
                self._after = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                self._take_input(fields)
        for session in self._sessions.values():
            if session.pending and not session.ended:
                self._write_fifo(session, b"")

    def _take_input(self, fields: dict) -> None:
        try:
            message = protocol.decode_session_input(fields)
            if self._key is not None:
                signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
                if not verify_input(self._key, fields.get("m", fields.get(b"m")), signature):
                    raise protocol.ProtocolError("bad or missing MAC")
            if message.node not in (None, self.node) or (self._key is not None and message.node is None):
                raise protocol.ProtocolError(f"for node {message.node}, not {self.node}")
            session = self._sessions.get(message.job_id)
            if session is None or session.ended or session.launch_id != message.launch_id:
                raise protocol.ProtocolError(f"no session of {message.launch_id} runs here")
            data = base64.b64decode(message.data, validate=True)
        except (protocol.ProtocolError, binascii.Error, ValueError) as exc:
            self.refused += 1
            self._warn_once(str(exc)[:80], f"session input refused: {exc}")
            return
        self._write_fifo(session, b"".join(frames(data, message.rows, message.cols)))

    def _write_fifo(self, session: _Session, data: bytes) -> None:
        """Append ``data`` (whole frames) to what waits for the session's terminal and write what
        the pipe takes now; a frame the pipe has no room for waits for the next round."""
        session.pending = (session.pending + data)[:PENDING_MAX] if data else session.pending
        if session.fifo is None:
            try:
                session.fifo = os.open(self._job_dir(session.job_id) / INPUT_FIFO,
                                       os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                return  # its terminal host is not up yet (ENXIO), or gone: kept for the next round
        while session.pending:
            frame = _first_frame(session.pending)
            if frame is None:
                session.pending = b""
                break
            try:
                written = os.write(session.fifo, frame)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ENXIO):
                    self._close_fifo(session)
                return
            session.pending = session.pending[written:]
            self.relayed_bytes += written

    def _close_fifo(self, session: _Session) -> None:
        if session.fifo is not None:
            os.close(session.fifo)
            session.fifo = None

    # ------------------------------------------------------------------ output

    def _ship_output(self, client) -> None:
        entries = []
        for job_id, session in list(self._sessions.items()):
            chunk = read_output(self._job_dir(job_id) / "output.log", session.offset, session.anchor,
                                protocol.SESSION_OUTPUT_BYTES, OUTPUT_LAG_BYTES)
            data = chunk.data if chunk is not None else b""
            if data or session.ended:
                message = protocol.SessionOutput(
                    node=self.node, job_id=job_id, launch_id=session.launch_id,
                    data=base64.b64encode(data).decode(), gap=bool(chunk and chunk.gap), eof=session.ended,
                )
                entries.append((job_id, session, chunk, signing.signed(protocol.encode(message), self._key)))
        if not entries:
            return
        pipe = client.pipeline(transaction=False)
        for job_id, _session, _chunk, fields in entries:
            stream = protocol.session_output_stream(self.node, job_id)
            pipe.xadd(stream, fields, maxlen=SESSION_STREAM_MAXLEN, approximate=True)
            pipe.expire(stream, OUTPUT_KEPT_S)
        results = pipe.execute(raise_on_error=False)
        failed = [r for r in results[0::2] if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        if any(isinstance(r, Exception) for r in results[1::2]):
            # A node ACL user made before nodes could EXPIRE: output still flows; say how to fix it.
            self._warn_once("expire", "session output streams get no TTL here (EXPIRE refused): "
                            "re-apply this node's Redis ACL line (manage.py agent_acl)")
        for job_id, session, chunk, _fields in entries:  # advanced once Redis has the chunk
            if chunk is not None and chunk.data:
                session.offset, session.anchor = chunk.offset + len(chunk.data), chunk.anchor
                self.shipped_bytes += len(chunk.data)
            if session.ended:
                self._close_fifo(session)
                del self._sessions[job_id]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 100:
            self._warned.add(key)
            log.warning("%s", message)


def _first_frame(buffer: bytes) -> bytes | None:
    """The first whole frame of ``buffer`` (frames are queued whole, so one is always there)."""
    if buffer[:1] == FRAME_RESIZE:
        return buffer[:5] if len(buffer) >= 5 else None
    if buffer[:1] == FRAME_DATA and len(buffer) >= 3:
        end = 3 + struct.unpack(">H", buffer[1:3])[0]
        return buffer[:end] if len(buffer) >= end else None
    return None
