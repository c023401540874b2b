"""The wire schema of the notebook tunnel (``colony jupyter``): byte streams between the control
plane's notebook proxy and a notebook server listening on 127.0.0.1 inside a job, carried over
Redis streams as commands and session keystrokes are. No port on a node is open to anyone.

Each proxied TCP connection is a *conn*: 32 random hex digits the proxy picks.

- control plane -> node: :class:`TunnelInput` entries on the node's tunnel input stream
  (:func:`tunnel_input_stream`), which only the control plane may append to and only that node
  may read. Each is MACed with the node's key in a domain of its own (:func:`sign_input`): no
  command, session keystroke or agent event passes as tunnel input, nor tunnel input as any of them.
- node -> control plane: :class:`TunnelOutput` entries on one stream per conn
  (:func:`tunnel_output_stream`), which only that node may append to, signed like every agent
  message (:func:`agents.signing.signed`).

``seq`` numbers each direction's entries of a conn from 0: a reader that sees one missing (a
trimmed stream) ends the conn instead of passing on a corrupted byte stream.

Like :mod:`agents.protocol`, this module must never import Django.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, TypeAdapter

from agents import protocol
from agents.domain_mac import DomainMac

TUNNEL_CHUNK_BYTES = 32 * 1024  # raw bytes in one entry, either direction
_B64_MAX = (TUNNEL_CHUNK_BYTES + 2) // 3 * 4
_B64 = r"^[A-Za-z0-9+/]*={0,2}$"
CONN_RE = r"^[0-9a-f]{32}$"

# A job whose launch env sets NOTEBOOK_IDLE_ENV runs a notebook server (``agents.notebooks``); the
# control plane adds NOTEBOOK_TOKEN_ENV to the launch (never to the job's stored env): the token
# the server demands, which the proxy adds to every request it forwards.
NOTEBOOK_IDLE_ENV = "COLONY_NOTEBOOK_IDLE_S"
NOTEBOOK_TOKEN_ENV = "COLONY_NOTEBOOK_TOKEN"
NOTEBOOK_PATH_PREFIX = "/notebooks/"  # the server's base URL is NOTEBOOK_PATH_PREFIX + "<job id>/"

_INPUT_CONTEXT = b"colony-tunnel:"


def tunnel_input_stream(node: str) -> str:
    """Bytes for the notebook servers of ``node``'s jobs; the control plane writes it."""
    return f"colony:node:{node}:tunnel-input"


def tunnel_output_stream(node: str, conn: str) -> str:
    """What a notebook server on ``node`` answered on connection ``conn``; only that node writes it."""
    return f"colony:node:{node}:tunnel-output:{conn}"


def notebook_idle_s(env: dict[str, str]) -> int | None:
    """The idle timeout of a notebook job (from its launch env), or None for any other job."""
    value = env.get(NOTEBOOK_IDLE_ENV)
    if value is None or not value.isdigit():
        return None
    return min(max(int(value), protocol.SESSION_IDLE_MIN_S), protocol.SESSION_IDLE_MAX_S)


def notebook_base_url(job_id: int) -> str:
    return f"{NOTEBOOK_PATH_PREFIX}{int(job_id)}/"


class TunnelInput(protocol._Command):
    """``open``: connect conn to the notebook server of attempt ``launch_id`` of job ``job_id``;
    ``data``: bytes for it (base64); ``close``: the proxy's side is gone."""

    kind: Literal["tunnel"] = "tunnel"
    op: Literal["open", "data", "close"]
    job_id: int = Field(gt=0, le=protocol.ID_MAX)
    launch_id: str = Field(min_length=1, max_length=64)
    conn: str = Field(pattern=CONN_RE)
    seq: int = Field(ge=0, le=protocol.ID_MAX)
    data: str = Field(default="", max_length=_B64_MAX, pattern=_B64)


class TunnelOutput(protocol._NodeMessage):
    """Bytes the notebook server sent on ``conn`` (base64); ``eof``: the conn is over (``error``
    says why when it did not end well, for the user)."""

    kind: Literal["tunnel_output"] = "tunnel_output"
    job_id: int = Field(gt=0, le=protocol.ID_MAX)
    conn: str = Field(pattern=CONN_RE)
    seq: int = Field(ge=0, le=protocol.ID_MAX)
    data: str = Field(default="", max_length=_B64_MAX, pattern=_B64)
    eof: bool = False
    error: str | None = Field(default=None, max_length=300)


_input_adapter: TypeAdapter = TypeAdapter(TunnelInput)
_output_adapter: TypeAdapter = TypeAdapter(TunnelOutput)


def decode_input(fields: dict) -> TunnelInput:
    """Parse one tunnel-input entry; raises :class:`protocol.ProtocolError` (the MAC is the agent's to check)."""
    return protocol._parse(_input_adapter, fields, protocol._COMMAND_FIELDS)


def decode_output(fields: dict) -> TunnelOutput:
    """Parse one tunnel-output entry; raises :class:`protocol.ProtocolError`."""
    return protocol._parse(_output_adapter, fields, protocol._AGENT_FIELDS)


# A tunnel input's ``m``, MACed by the node's key in the tunnel's own domain.
_INPUT_MAC = DomainMac(_INPUT_CONTEXT)
sign_input, verify_input, signed_input = _INPUT_MAC.sign, _INPUT_MAC.verify, _INPUT_MAC.signed
