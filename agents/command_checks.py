"""Whether a command entry read from the node's stream may be applied here: its signature, node
and age (:func:`refusal`), and whether a later entry of the same batch withdraws a launch
(:func:`withdrawn_launches`). Pure: no Redis, no runner, no clock but the wall time of ``refusal``.
"""

from __future__ import annotations

import time
from typing import Callable

from agents import protocol, signing


def refusal(fields: dict, command, *, node: str, key: bytes | None, max_age: float,
            max_skew: float) -> str | None:
    """Why ``command`` (parsed from ``fields``) must not be applied on ``node``, or None.

    With a key: it must be MACed with this node's key in the command domain, name this node,
    and have been issued within ``max_age`` (and not beyond ``max_skew`` ahead). A launch must
    name its attempt (checked against the newest seen by the caller). Without a key
    (authentication off) only a command naming another node is refused.
    """
    if key is None:
        if command.node is not None and command.node != node:
            return f"it is for node {command.node}, not {node}"
        return None
    signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
    if signature is None:
        return "unsigned (this agent takes only commands MACed with its node key)"
    if not signing.verify_command(key, fields.get("m", fields.get(b"m")), signature):
        return "bad signature (not MACed with this node's key)"
    if command.node != node:
        # Genuine, but for another node (copied into this stream, or sent before a rename).
        return f"it is for node {command.node}, not {node}" if command.node else "it names no node"
    if command.issued_at is None:
        return "it carries no issue time"
    age = time.time() - command.issued_at
    if age > max_age:
        return f"stale: issued {age:.0f}s ago (at most {max_age:.0f}s)"
    if -age > max_skew:
        return f"issued {-age:.0f}s in the future (clock skew of at most {max_skew:.0f}s)"
    if isinstance(command, protocol.LaunchJob) and command.attempt is None:
        return "a launch that names no attempt"
    return None


def withdrawn_launches(entries, refused: Callable[[dict, object], str | None]) -> set:
    """Ids of the launch entries that a later entry of the same batch withdraws: a stop of that
    attempt (or of any attempt of the job), or a launch of a newer attempt. Starting one would
    run an attempt the control plane has already given up (a paused agent's backlog holds
    both the launch and, further on, the stop that requeue sent). Only commands this node would
    apply count (``refused`` says why one would not)."""
    withdrawn, stopped, newest = set(), {}, {}
    for entry_id, fields in reversed(entries):
        if fields is None:
            continue
        try:
            command = protocol.decode_command(fields)
        except protocol.ProtocolError:
            continue
        if refused(fields, command):
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


def older(running: protocol.LaunchJob, incoming: protocol.LaunchJob) -> bool:
    """Whether the running launch is an earlier attempt than the incoming one."""
    return running.attempt is not None and incoming.attempt is not None and running.attempt < incoming.attempt


def entry_ms(entry_id) -> int:
    """The Redis server time (ms) at which a stream entry was added: the first part of its id."""
    return int(text(entry_id).split("-", 1)[0])


def text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
