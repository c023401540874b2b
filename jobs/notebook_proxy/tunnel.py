"""The control plane's end of one tunnel connection (:mod:`agents.tunnel_protocol`): bytes to a
notebook server on a node, MACed with that node's key in the tunnel's domain, onto the node's
tunnel input stream; bytes back from the connection's own output stream, each entry accepted only
signed by that node's key (when agents authenticate), for this connection and job, in sequence.
Anything else on that stream is logged and dropped. asyncio, on ``redis.asyncio``."""

from __future__ import annotations

import base64
import logging
import secrets
import time

import redis

from agents import protocol, signing, tunnel, tunnel_protocol

log = logging.getLogger(__name__)

INPUT_STREAM_MAXLEN = 20_000
OUTPUT_KEPT_S = tunnel.OUTPUT_KEPT_S  # the node sets it as it writes; each read here renews it
CLOSED_KEPT_S = 30
BLOCK_MS = 5000


class TunnelClosed(Exception):
    """The connection is over; ``str()`` says why when it did not end well."""


class Tunnel:
    """One connection to attempt ``launch_id``'s notebook server on ``node``. ``key``: the node's
    key (None: agents do not authenticate, and neither side signs)."""

    def __init__(self, client, node: str, job_id: int, launch_id: str, key: bytes | None):
        self.client, self.node, self.job_id, self.launch_id, self.key = client, node, job_id, launch_id, key
        self.conn = secrets.token_hex(16)
        self._seq = 0
        self._next_in = 0
        self._after = "0-0"
        self.eof = False
        self.error: str | None = None
        self.dropped = 0  # entries on our output stream that were not the node's, or out of order

    @property
    def output_stream(self) -> str:
        return tunnel_protocol.tunnel_output_stream(self.node, self.conn)

    async def _put(self, op: str, data: bytes = b"") -> None:
        message = tunnel_protocol.TunnelInput(
            node=self.node, issued_at=time.time(), op=op, job_id=self.job_id, launch_id=self.launch_id,
            conn=self.conn, seq=self._seq, data=base64.b64encode(data).decode())
        self._seq += 1
        await self.client.xadd(tunnel_protocol.tunnel_input_stream(self.node),
                               tunnel_protocol.signed_input(protocol.encode(message), self.key),
                               maxlen=INPUT_STREAM_MAXLEN, approximate=True)

    async def open(self) -> None:
        await self._put("open")

    async def send(self, data: bytes) -> None:
        if self.eof:
            raise TunnelClosed(self.error or "the notebook server closed the connection")
        step = tunnel_protocol.TUNNEL_CHUNK_BYTES
        for start in range(0, len(data), step):
            await self._put("data", data[start:start + step])

    async def recv(self) -> bytes:
        """The next bytes from the server; b"" once the connection is over (``error`` says why)."""
        while not self.eof:
            answer = await self.client.xread({self.output_stream: self._after}, count=64, block=BLOCK_MS)
            out = bytearray()
            for _name, entries in answer or []:
                for entry_id, fields in entries:
                    self._after = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    out += self._take(fields)
            if answer:
                await self.client.expire(self.output_stream, OUTPUT_KEPT_S)
            if out:
                return bytes(out)
        return b""

    def _take(self, fields: dict) -> bytes:
        if self.eof:
            return b""
        try:
            message = tunnel_protocol.decode_output(fields)
            if message.node != self.node or message.conn != self.conn or message.job_id != self.job_id:
                raise protocol.ProtocolError(f"output of {message.node}/{message.conn[:8]} in {self.output_stream}")
            if self.key is not None:
                signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
                if not signing.verify(self.key, fields.get("m", fields.get(b"m")), signature):
                    raise protocol.ProtocolError(f"not signed by node {self.node}")
            data = base64.b64decode(message.data)
        except (protocol.ProtocolError, ValueError) as exc:
            self.dropped += 1
            log.warning("notebook tunnel of job %s: entry dropped: %s", self.job_id, exc)
            return b""
        if message.seq != self._next_in:
            self.eof, self.error = True, "part of the notebook server's answer was lost on the way"
            return b""
        self._next_in += 1
        if message.eof:
            self.eof, self.error = True, message.error
        return data

    async def close(self) -> None:
        """Tell the node the proxy's side is gone (unless the node ended it); the output stream
        expires shortly (not deleted: an answer already on its way would make it anew; the node's own
        TTL then bounds it)."""
        try:
            if not self.eof:
                await self._put("close")
            await self.client.expire(self.output_stream, CLOSED_KEPT_S)
        except redis.RedisError as exc:
            log.info("notebook tunnel %s of job %s: close not delivered (%s)", self.conn[:8], self.job_id, exc)
