"""MACs by a node's key in a domain of their own: the control plane's keystrokes for a session
(:mod:`agents.sessions`) and its bytes for a notebook tunnel (:mod:`agents.tunnel_protocol`) are
signed with the same node key as commands, so each kind prefixes its own context before the MAC,
and none can pass as another (nor as a command, which :mod:`agents.signing` signs bare).

Plain ``hmac`` rather than :mod:`agents.signing`, which imports the modules that use this one.
"""

from __future__ import annotations

import hashlib
import hmac

from agents.protocol import SIGNATURE_FIELD


class DomainMac:
    """HMAC-SHA256 of ``context + payload`` (a str payload is taken as its UTF-8 bytes), in hex."""

    def __init__(self, context: bytes):
        self.context = context

    def sign(self, key: bytes, payload: bytes | str) -> str:
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        return hmac.new(key, self.context + data, hashlib.sha256).hexdigest()

    def verify(self, key: bytes, payload: bytes | str, signature: bytes | str | None) -> bool:
        """True when ``signature`` is :meth:`sign` of ``payload`` by ``key`` (constant time)."""
        if signature is None:
            return False
        if isinstance(signature, str):
            signature = signature.encode("utf-8", "replace")
        return hmac.compare_digest(self.sign(key, payload).encode("ascii"), signature)

    def signed(self, fields: dict[str, str], key: bytes | None) -> dict[str, str]:
        """Stream fields from :func:`agents.protocol.encode` plus the MAC of their ``m`` (unchanged
        without a key: agents that do not authenticate)."""
        if key is None:
            return fields
        return {**fields, SIGNATURE_FIELD: self.sign(key, fields["m"])}
