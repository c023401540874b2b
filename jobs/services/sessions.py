"""Interactive sessions on the control plane: the relay between a user's ``colony shell`` (through
the API, with their token) and the node that runs the session (through Redis). No port on a node
is open to anyone: the API writes the user's keystrokes onto the node's session input stream,
MACed with that node's key (:func:`agents.sessions.sign_input`), and reads what the terminal
printed from the job's output stream, which only that node may append to and whose entries must
carry its signature. An interactive job is otherwise an ordinary job: placed, accounted, stopped
and ended like any other (:mod:`agents.sessions` has the node's half).

What must not live here: who may attach (the API view asks :func:`may_attach`), job state changes
(:mod:`jobs.services.lifecycle`).
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass

import redis

from agents import protocol, sessions
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.commands import command_key, launch_id
from monitoring.services import registry
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

INPUT_STREAM_MAXLEN = 1000
OUTPUT_WAIT_MAX_S = 20.0
OUTPUT_ENTRIES = 64  # per answer: about 1 MiB of terminal output at most
OUTPUT_KEPT_S = sessions.OUTPUT_KEPT_S  # the node sets it as it writes; each read here renews it
ENTRY_ID_RE = r"^[0-9]{1,20}-[0-9]{1,20}$"
DEFAULT_IDLE_S = 1800


class SessionUnavailable(Exception):
    """The job is not a session that can take input now; the message says why, for the user."""


def is_interactive(job: Job) -> bool:
    return protocol.session_idle_s(job.env or {}) is not None


def idle_timeout_s(job: Job) -> int | None:
    return protocol.session_idle_s(job.env or {})


def may_attach(user, job: Job) -> bool:
    """Only its owner types into a session: a teammate who may see the job (or an operator) may
    not act as its account."""
    return job.owner_id == user.pk


def session_node(job: Job) -> str | None:
    """The node that runs the job's current attempt (a session runs on one), or None."""
    return (Allocation.objects.filter(job=job, attempt=job.attempt, released_at__isnull=True)
            .values_list("gpu__node__name", flat=True).first())


def send_input(job: Job, data: bytes, rows: int | None = None, cols: int | None = None) -> None:
    """Put ``data`` (at most ``protocol.SESSION_INPUT_BYTES``) and/or a window size on the way to
    the job's terminal; raises :class:`SessionUnavailable` when it does not run one now."""
    if not is_interactive(job):
        raise SessionUnavailable(f"job {job.pk} is not an interactive session")
    if job.state != JobState.RUNNING:
        raise SessionUnavailable(f"job {job.pk} is {job.state.lower()}, not running: nothing to type into")
    node = session_node(job)
    if node is None:
        raise SessionUnavailable(f"job {job.pk} holds no node now")
    message = protocol.SessionInput(node=node, issued_at=time.time(), job_id=job.pk,
                                    launch_id=launch_id(job.pk, job.attempt),
                                    data=base64.b64encode(data).decode(), rows=rows, cols=cols)
    try:
        get_redis().xadd(protocol.session_input_stream(node),
                         sessions.signed_input(protocol.encode(message), command_key(node)),
                         maxlen=INPUT_STREAM_MAXLEN, approximate=True)
    except redis.RedisError as exc:
        raise SessionUnavailable(f"the relay to node {node} is unavailable ({exc}); try again") from None


@dataclass(frozen=True)
class Output:
    data: bytes
    next: str | None  # the cursor for the next read
    eof: bool  # the node shipped the end of the session's output
    gap: bool  # some output was skipped (the reader fell behind the stream's bounded history)


def read_output(job: Job, after: str | None, wait_s: float) -> Output:
    """What the job's terminal printed after entry ``after`` (None: from the oldest kept), waiting
    up to ``wait_s`` (at most ``OUTPUT_WAIT_MAX_S``) for something new. Entries not signed by the
    node that holds the job are skipped."""
    node = session_node(job) or _last_node(job)
    if node is None or not is_interactive(job):
        return Output(b"", after, False, False)
    stream = protocol.session_output_stream(node, job.pk)
    client = get_redis()
    block_ms = int(max(0.0, min(wait_s, OUTPUT_WAIT_MAX_S)) * 1000)
    answer = client.xread({stream: after or "0-0"}, count=OUTPUT_ENTRIES, block=block_ms or None)
    client.expire(stream, OUTPUT_KEPT_S)
    data, eof, gap, cursor = bytearray(), False, False, after
    required = registry.agent_auth_required()
    for _name, entries in answer or []:
        for entry_id, fields in entries:
            cursor = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            try:
                chunk = protocol.decode_session_output(fields)
                if chunk.node != node or chunk.job_id != job.pk:
                    raise protocol.ProtocolError(f"output of job {chunk.job_id} on {chunk.node} in {stream}")
                registry.authenticate(fields, chunk, required)
            except protocol.ProtocolError as exc:
                log.warning("session output of job %s skipped: %s", job.pk, exc.reason)
                continue
            data += base64.b64decode(chunk.data)
            gap = gap or chunk.gap
            eof = eof or chunk.eof
    return Output(bytes(data), cursor, eof, gap)


def _last_node(job: Job) -> str | None:
    """Where the job's last attempt ran (its allocations are released once it ended)."""
    return (Allocation.objects.filter(job=job, attempt=job.attempt).order_by("-pk")
            .values_list("gpu__node__name", flat=True).first())
