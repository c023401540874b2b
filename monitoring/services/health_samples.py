"""What node health reads of every node's latest sample (:mod:`monitoring.services.live` keeps
them): decoded straight from the stored JSON into only the fields it reads."""

from __future__ import annotations

import msgspec
import redis

from monitoring.services.live import NODE_HASH, STALE_AFTER_S, UNDECODABLE, _fresh


class NodeListing(msgspec.Struct, frozen=True, gc=False):
    """What node health reads of a node's last sample: when, and what it says it runs (its jobs,
    their attempts' launch ids, their duty cycles; ``running_launches`` None where the agent does
    not say). Decoded straight from the stored JSON, every GPU's and job's readings skipped
    (checked to be lists, as :func:`live.latest_nodes` checks them, but not decoded): the check reads a
    thousand samples every two seconds, and building a dict of every field was a fifth of it.
    Read as the dict :func:`live.latest_nodes` gives (``sample["ts"]``, ``sample.get("running_jobs")``)."""

    ts: float
    gpus: msgspec.Raw  # (a list: see _listing)
    jobs: msgspec.Raw = msgspec.Raw(b"[]")
    # (None where the sample does not say, as the dict has no such key)
    running_jobs: list[int] | None = None
    running_launches: list[str] | None = None
    duty_cycles: list[float] | None = None

    def __getitem__(self, name: str):
        return getattr(self, name)

    def get(self, name: str, default=None):
        value = getattr(self, name, default)
        return default if value is None else value


_listing_decoder = msgspec.json.Decoder(NodeListing)


def _listing(raw: bytes | str) -> NodeListing | None:
    try:
        listing = _listing_decoder.decode(raw)
    except UNDECODABLE:
        return None
    # (the readings as lists, as latest_nodes requires them: a JSON value that starts with "[")
    return listing if memoryview(listing.gpus)[:1] == b"[" and memoryview(listing.jobs)[:1] == b"[" else None


def latest_listings(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, NodeListing]:
    """Node name -> what its last sample says it runs, for nodes heard from within ``max_age``
    seconds; what :func:`live.latest_nodes` reads, typed."""
    return _fresh(client.hgetall(NODE_HASH).items(), _listing, max_age)


class OnDemand:
    """:func:`latest_listings` read node by node as asked (``get``): for a check that needs the
    samples of the few nodes coming back from the dead, not of every node."""

    def __init__(self, client: redis.Redis, max_age: float = STALE_AFTER_S):
        self.client, self.max_age = client, max_age

    def get(self, name: str, default=None):
        return _fresh([(name, self.client.hget(NODE_HASH, name))], _listing, self.max_age).get(name, default)
