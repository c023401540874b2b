"""The node's half of the notebook tunnel (``colony jupyter``): a thread of the agent that joins
the control plane's proxy to the notebook servers of this node's jobs, one TCP connection to
127.0.0.1:<port> per proxied connection, over Redis (:mod:`agents.tunnel_protocol`).

What it trusts: an entry of its tunnel input stream only with the node key's MAC in the tunnel's
domain (:func:`tunnel_protocol.verify_input`), for this node, for an attempt of a notebook job
this node runs now, and in sequence; anything else is counted and dropped, never raised. It
connects only to the port the agent itself picked at launch (``notebook.port``, which the job
cannot write). It writes only its own per-connection output streams, signed. Everything is
bounded: bytes per entry, bytes waiting for a slow server, connections per job and per node, and
a connection idle for an hour is closed.

Without a notebook running here (nor one ended in the last ten minutes) it makes no Redis round
trip at all.
"""

from __future__ import annotations

import base64
import binascii
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import redis

from agents import notebooks, protocol, signing, tunnel_protocol

log = logging.getLogger(__name__)

POLL_S = 0.02
PENDING_MAX = 4 * 1024 * 1024  # bytes for a server that does not read them yet; past this, the conn ends
CONNS_PER_JOB = 64
CONNS_PER_NODE = 512
CONN_IDLE_S = 3600.0
READS_PER_ROUND = 8  # chunks read from one connection before the others get their turn
OUTPUT_STREAM_MAXLEN = 4096
# A connection's output stream outlives its last write by an hour (set on every write): one whose
# proxy died before reading it goes too.
OUTPUT_KEPT_S = 3600
INPUT_LOOKBACK_MS = 5_000
CONNECT_TIMEOUT_S = 2.0
# After its last notebook ended the relay goes on reading, slowly, this long: a browser still open on
# it hears at once that the session ended instead of waiting out the proxy's timeout.
ANSWER_ENDED_S = 600.0
IDLE_POLL_S = 1.0


@dataclass
class _Conn:
    conn: str
    job_id: int
    launch_id: str
    sock: socket.socket
    next_in: int = 1  # the open was entry 0
    next_out: int = 0
    pending: bytearray = field(default_factory=bytearray)
    active_at: float = field(default_factory=time.monotonic)


class TunnelRelay:
    """Proxied connections to this node's notebook servers. ``track()`` is called by the agent
    loop; the rest runs on the relay's thread (:meth:`start`) or, in tests, through :meth:`step`."""

    def __init__(self, node: str, redis_url: str, key: bytes | None, job_dir: Callable[[int], Path]):
        self.node, self.redis_url, self._key, self._job_dir = node, redis_url, key, job_dir
        self._lock = threading.Lock()
        self._tracked: dict[int, str] = {}
        self._conns: dict[str, _Conn] = {}
        self._after: str | None = None
        self._out: list[tuple[str, dict]] = []  # (stream, fields) to XADD this round
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy_sockets = False
        self._busy_until = 0.0
        self.refused = 0  # input entries dropped: malformed, unsigned, another node's, unknown, out of order
        self._warned: set[str] = set()

    def track(self, launches: dict[int, str]) -> None:
        """The notebook jobs running now (job id -> launch id), from the agent loop."""
        with self._lock:
            self._tracked = dict(launches)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tunnel-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for conn in list(self._conns.values()):
            self._drop(conn)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _run(self) -> None:
        client, backoff = None, 0.2
        while not self._stop.is_set():
            try:
                with self._lock:
                    busy = bool(self._tracked or self._conns)
                if busy:
                    self._busy_until = time.monotonic() + ANSWER_ENDED_S
                elif time.monotonic() > self._busy_until:
                    self._stop.wait(0.2)
                    continue
                if client is None:
                    client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2.0, socket_timeout=5.0,
                                                  protocol=2)
                block_s = 0 if self._busy_sockets else POLL_S if busy else IDLE_POLL_S
                self.step(client, block_ms=int(block_s * 1000))
                backoff = 0.2
            except redis.RedisError as exc:
                self._warn_once("redis", f"tunnel relay: Redis unavailable ({exc}); retrying")
                if client is not None:
                    client.close()
                client = None
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
            except Exception:  # a bug here must never take the agent (or its jobs) down
                log.exception("tunnel relay: unexpected error; carrying on")
                self._stop.wait(1.0)
        if client is not None:
            client.close()

    def step(self, client, block_ms: int = 0) -> None:
        """One round: end conns of ended jobs, wait up to ``block_ms`` for the servers (when a conn
        is open: what they answer goes out at once) or else for input, then move bytes between the
        sockets and their streams."""
        self._follow()
        if self._conns:
            self._pump(block_ms / 1000)
            self._flush(client)
            self._read_input(client, 0)
        else:
            self._read_input(client, block_ms)
        self._pump(0)
        self._flush(client)

    # ------------------------------------------------------------------ input

    def _follow(self) -> None:
        with self._lock:
            tracked = dict(self._tracked)
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if tracked.get(conn.job_id) != conn.launch_id:
                self._end(conn, "the notebook session ended")
            elif now - conn.active_at > CONN_IDLE_S:
                self._end(conn, "the connection was idle too long")

    def _read_input(self, client, block_ms: int) -> None:
        stream = tunnel_protocol.tunnel_input_stream(self.node)
        if self._after is None:  # from a little before now: older entries are an earlier agent's
            seconds, micros = client.time()
            self._after = f"{max(0, seconds * 1000 + micros // 1000 - INPUT_LOOKBACK_MS)}-0"
        answer = client.xread({stream: self._after}, count=256, block=block_ms or None)
        for _name, entries in answer or []:
            for entry_id, fields in entries:
                self._after = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                self._take(fields)

    def _take(self, fields: dict) -> None:
        try:
            message = tunnel_protocol.decode_input(fields)
            if self._key is not None:
                signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
                if not tunnel_protocol.verify_input(self._key, fields.get("m", fields.get(b"m")), signature):
                    raise protocol.ProtocolError("bad or missing MAC")
            if message.node != self.node and (self._key is not None or message.node is not None):
                raise protocol.ProtocolError(f"for node {message.node}, not {self.node}")
            data = base64.b64decode(message.data, validate=True)
        except (protocol.ProtocolError, binascii.Error, ValueError) as exc:
            self._refuse(str(exc))
            return
        with self._lock:
            running = self._tracked.get(message.job_id)
        if running != message.launch_id:
            self._refuse(f"no notebook of {message.launch_id} runs here")
            if message.op == "open":  # the control plane's own entry: worth an answer the user sees
                self._emit(_Conn(message.conn, message.job_id, message.launch_id, sock=None), b"", eof=True,
                           error="this notebook session is not running any more (it ended, or was requeued)")
            return
        conn = self._conns.get(message.conn)
        if message.op == "open":
            if conn is not None or message.seq != 0:
                self._refuse(f"connection {message.conn[:8]} opened twice")
                return
            self._open(message)
            return
        if conn is None or conn.job_id != message.job_id or conn.launch_id != message.launch_id:
            self._refuse(f"no open connection {message.conn[:8]} of job {message.job_id}")
            return
        if message.seq != conn.next_in:
            self._end(conn, f"tunnel input lost (entry {message.seq}, expected {conn.next_in})")
            return
        conn.next_in += 1
        conn.active_at = time.monotonic()
        if message.op == "close":
            self._drop(conn)
            return
        if len(conn.pending) + len(data) > PENDING_MAX:
            self._end(conn, "the notebook server does not read what it is sent")
            return
        conn.pending += data

    def _open(self, message: tunnel_protocol.TunnelInput) -> None:
        probe = _Conn(message.conn, message.job_id, message.launch_id, sock=None)  # type: ignore[arg-type]
        same_job = sum(1 for conn in self._conns.values() if conn.job_id == message.job_id)
        if same_job >= CONNS_PER_JOB or len(self._conns) >= CONNS_PER_NODE:
            self._emit(probe, b"", eof=True, error="too many open connections to this notebook")
            return
        port = notebooks.read_port(self._job_dir(message.job_id))
        try:
            if port is None:
                raise OSError("no port recorded")
            sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
        except OSError:
            self._emit(probe, b"", eof=True, error="the notebook server is not answering yet (still starting?)")
            return
        sock.setblocking(False)
        probe.sock = sock
        self._conns[message.conn] = probe

    # ------------------------------------------------------------------ sockets

    def _pump(self, wait_s: float) -> None:
        if not self._conns:
            self._busy_sockets = False
            return
        by_socket = {conn.sock: conn for conn in self._conns.values()}
        try:
            readable, writable, _ = select.select(list(by_socket), [s for s, c in by_socket.items() if c.pending],
                                                  [], wait_s)
        except (OSError, ValueError):  # a socket closed under us: find it next round
            readable, writable = [], []
        for sock in writable:
            conn = by_socket[sock]
            try:
                sent = sock.send(conn.pending)
            except BlockingIOError:
                continue
            except OSError:
                self._end(conn, "the notebook server closed the connection")
                continue
            del conn.pending[:sent]
        busy = False
        for sock in readable:
            conn = by_socket[sock]
            if conn.conn not in self._conns:
                continue
            for _ in range(READS_PER_ROUND):
                try:
                    data = sock.recv(tunnel_protocol.TUNNEL_CHUNK_BYTES)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._end(conn, None)
                    break
                busy = True
                conn.active_at = time.monotonic()
                self._emit(conn, data)
        self._busy_sockets = busy or any(conn.pending for conn in self._conns.values())

    def _emit(self, conn: _Conn, data: bytes, *, eof: bool = False, error: str | None = None) -> None:
        message = tunnel_protocol.TunnelOutput(node=self.node, job_id=conn.job_id, conn=conn.conn, seq=conn.next_out,
                                               data=base64.b64encode(data).decode(), eof=eof, error=error)
        conn.next_out += 1
        self._out.append((tunnel_protocol.tunnel_output_stream(self.node, conn.conn),
                          signing.signed(protocol.encode(message), self._key)))

    def _end(self, conn: _Conn, error: str | None) -> None:
        """Tell the proxy the connection is over (why, if it did not end well), and close it."""
        self._emit(conn, b"", eof=True, error=error)
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.conn, None)
        if conn.sock is not None:
            conn.sock.close()

    def _flush(self, client) -> None:
        if not self._out:
            return
        pipe = client.pipeline(transaction=False)
        for stream, fields in self._out:
            pipe.xadd(stream, fields, maxlen=OUTPUT_STREAM_MAXLEN, approximate=True)
        streams = {stream for stream, _fields in self._out}
        for stream in streams:
            pipe.expire(stream, OUTPUT_KEPT_S)
        appended = len(self._out)
        self._out = []
        results = pipe.execute(raise_on_error=False)
        failed = [r for r in results[:appended] if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        if any(isinstance(r, Exception) for r in results[appended:]):
            # A node ACL user made before nodes could EXPIRE: answers still flow; say how to fix it.
            self._warn_once("expire", "tunnel output streams get no TTL here (EXPIRE refused): "
                            "re-apply this node's Redis ACL line (manage.py agent_acl)")

    def _refuse(self, why: str) -> None:
        self.refused += 1
        self._warn_once(why[:60], f"tunnel input refused: {why}")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 100:
            self._warned.add(key)
            log.warning("%s", message)
