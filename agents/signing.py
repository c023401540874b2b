"""Agent credentials: per-node signing keys, message signatures, and each node's Redis ACL user.

Both ends import this module (the agent to sign, the server to verify and to print credentials
for operators); like :mod:`agents.protocol` it must never import Django. Standard library only.

One server secret makes every credential, so the control plane stores nothing per node:

- a node's **signing key** is ``HMAC-SHA256(secret, "colony-agent:" + node)``. The agent signs the
  exact bytes of each message it writes (the ``m`` field) with it and adds the hex signature as
  the stream field ``sig``; the server derives the key of the node the message *names* and
  compares in constant time. A node holding only its own key cannot post for another node.
- **commands** the control plane writes to a node's command stream are MACed with the same node
  key, but over ``"colony-command:" + m`` (:func:`sign_command`): a domain separation, so an
  agent's own signed event can never pass as a command, nor a command as an event (an event's
  ``m`` is a JSON object and never starts with that prefix). The agent already holds the key,
  so it needs nothing new to verify what it is told. What the MAC covers (the node, the time it
  was issued, a launch's attempt) is in :mod:`agents.protocol`; what the agent refuses is in
  :func:`agents.command_checks.refusal`.
- a node's **Redis password** is ``HMAC-SHA256(secret, "colony-redis:" + node)``, for a Redis ACL
  user (:func:`redis_acl_setuser`) that may read only its own command stream and only append to
  the streams agents write, so it can neither read other nodes' commands nor replay their
  messages.
"""

from __future__ import annotations

import hashlib
import hmac

from agents import protocol, tunnel_protocol

KEY_BYTES = 32
# Shorter server secrets are refused: every node key is only as strong as the secret.
MIN_SECRET_LENGTH = 16
_KEY_CONTEXT = "colony-agent:"
_REDIS_CONTEXT = "colony-redis:"
# Prefix of a command's MAC input (never the start of an agent message, which is a JSON object).
_COMMAND_CONTEXT = b"colony-command:"


def _derive(secret: str, context: str, node: str) -> bytes:
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(f"the agent secret must be at least {MIN_SECRET_LENGTH} characters")
    if not protocol.NODE_NAME_RE.match(node):
        raise ValueError(f"invalid node name {node!r}")
    return hmac.new(secret.encode("utf-8"), (context + node).encode("utf-8"), hashlib.sha256).digest()


def node_key(secret: str, node: str) -> bytes:
    """The signing key of ``node`` (32 bytes); operators install it as 64 hex digits."""
    return _derive(secret, _KEY_CONTEXT, node)


def parse_key(text: str) -> bytes:
    """A key as installed on a node (64 hex digits, surrounding whitespace ignored) -> bytes."""
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"an agent key is {KEY_BYTES * 2} hex digits (from `manage.py agent_key NODE`)")
    return key


def sign(key: bytes, payload: bytes | str) -> str:
    """Hex HMAC-SHA256 of ``payload`` (str is taken as its UTF-8 bytes)."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def verify(key: bytes, payload: bytes | str, signature: bytes | str | None) -> bool:
    """True when ``signature`` is ``payload``'s signature by ``key`` (constant-time compare)."""
    if signature is None:
        return False
    if isinstance(signature, str):
        signature = signature.encode("utf-8", "replace")
    return hmac.compare_digest(sign(key, payload).encode("ascii"), signature)


def signed(fields: dict[str, str], key: bytes | None) -> dict[str, str]:
    """Stream fields from :func:`protocol.encode` plus their signature (unchanged without a key)."""
    if key is None:
        return fields
    return {**fields, protocol.SIGNATURE_FIELD: sign(key, fields["m"])}


def _bytes(payload: bytes | str) -> bytes:
    return payload.encode("utf-8") if isinstance(payload, str) else payload


def sign_command(key: bytes, payload: bytes | str) -> str:
    """Hex MAC of a command's ``m`` by the target node's key, in the command domain."""
    return sign(key, _COMMAND_CONTEXT + _bytes(payload))


def verify_command(key: bytes, payload: bytes | str, signature: bytes | str | None) -> bool:
    """True when ``signature`` is :func:`sign_command` of ``payload`` by ``key`` (constant time)."""
    return verify(key, _COMMAND_CONTEXT + _bytes(payload), signature)


def signed_command(fields: dict[str, str], key: bytes | None) -> dict[str, str]:
    """Command stream fields from :func:`protocol.encode` plus their MAC (unchanged without a key)."""
    if key is None:
        return fields
    return {**fields, protocol.SIGNATURE_FIELD: sign_command(key, fields["m"])}


# ---------------------------------------------------------------- Redis ACL user per node


def redis_user(node: str) -> str:
    return f"colony-node-{node}"


def redis_password(secret: str, node: str) -> str:
    return _derive(secret, _REDIS_CONTEXT, node).hex()


def redis_acl_rules(node: str, password: str) -> list[str]:
    """``ACL SETUSER`` rules for ``node``'s agent: exactly the calls :class:`agents.agent.Agent` makes.

    Root permissions only append (``XADD``) to the node's own event, metric and log streams,
    write-only (``%W~``): a node can neither read nor trim, exhaust or flood another node's
    stream, nor touch the control plane's (its refusals of commands travel as events too).
    Selectors (Redis >= 7.0) give the other commands, each on its own keys: the node's command
    stream and heartbeat. Node names hold no glob characters, so the patterns match nothing
    else. Redis keeps only the password's SHA-256 (``#``), so the rule line holds no secret.
    """
    digest = hashlib.sha256(password.encode("utf-8")).hexdigest()
    return [
        "reset", "on", f"#{digest}", "resetchannels", "-@all",
        # TIME: the agent dates its command backlog by Redis's clock (a launch's lease), not its own.
        "+ping", "+time", "+xadd",
        f"%W~{protocol.node_events_stream(node)}", f"%W~{protocol.node_metrics_stream(node)}",
        f"%W~{protocol.node_logs_stream(node)}",
        # Interactive sessions: what each of its jobs' terminals printed (one stream per job).
        f"%W~{protocol.session_output_stream(node, '*')}",
        # Notebook tunnels: what its jobs' notebook servers answered (one stream per connection).
        f"%W~{tunnel_protocol.tunnel_output_stream(node, '*')}",
        # Own command stream (consumer group read, ack, create), own heartbeat: each key only
        # the commands it needs, so a node cannot, say, turn its command stream into a string.
        f"(~{protocol.command_stream(node)} +xreadgroup +xack +xgroup|create)",
        f"(~{protocol.heartbeat_key(node)} +set)",
        # Keystrokes for its sessions, which the control plane writes: read only, no group.
        f"(%R~{protocol.session_input_stream(node)} +xread)",
        f"(%R~{tunnel_protocol.tunnel_input_stream(node)} +xread)",
        # Code archives the control plane staged for this node's launches: read only.
        f"(%R~{protocol.code_key(node, '*')} +lrange +llen)",
        # Its own output streams expire a while after its last write, read or not (EXPIRE's key
        # is read-write: ~, on these keys and for this command only).
        f"(~{protocol.session_output_stream(node, '*')} +expire)",
        f"(~{tunnel_protocol.tunnel_output_stream(node, '*')} +expire)",
    ]


def redis_acl_setuser(node: str, password: str) -> str:
    """The ``ACL SETUSER`` line (for redis-cli, or without ``ACL SETUSER`` as a ``user`` line of
    an ACL file) for ``node``'s agent."""
    return " ".join(["ACL", "SETUSER", redis_user(node), *redis_acl_rules(node, password)])
