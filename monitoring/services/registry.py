"""Who the nodes are: agent authentication, and registrations from agents -> Node and Gpu rows.

Every reader of what agents write (metric ingest, agent events) calls :func:`authenticate` on each
parsed message before applying anything: under ``COLONY_AGENT_AUTH=required`` a message must be
signed with the key of the node it names (:mod:`agents.signing`), or it is rejected.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import protocol, signing
from agents.protocol import NodeRegistered
from monitoring.choices import NodeState
from monitoring.models import Gpu, Node

log = logging.getLogger(__name__)


class BadSignature(protocol.ProtocolError):
    """An agent message that is unsigned, or not signed by the node it names."""


class ForeignGpus(protocol.ProtocolError):
    """A registration naming GPUs that another node has (a node may register only its own)."""


def agent_auth_required() -> bool:
    """Whether agent messages must be signed (``COLONY_AGENT_AUTH``); warns once per process if not."""
    if settings.COLONY_AGENT_AUTH == "required":
        return True
    _warn_auth_off()
    return False


@functools.cache
def _warn_auth_off() -> None:
    log.warning("agent authentication is off (COLONY_AGENT_AUTH=off, or no COLONY_AGENT_SECRET): any client "
                "of Redis can post metrics and events for any node")


@functools.lru_cache(maxsize=65_536)
def _node_key(secret: str, node: str) -> bytes:
    return signing.node_key(secret, node)


def authenticate(fields: dict, message, required: bool | None = None) -> None:
    """Raise :class:`BadSignature` unless ``fields`` (the stream entry ``message`` was parsed from)
    carry a valid signature by the key of ``message.node``. Nothing is checked when authentication
    is off; ``required`` overrides the setting (readers look it up once per batch)."""
    if required is None:
        required = agent_auth_required()
    if not required:
        return
    signature = fields.get(protocol.SIGNATURE_FIELD, fields.get(protocol.SIGNATURE_FIELD.encode()))
    if signature is None:
        raise BadSignature("unsigned message (agent authentication is required)")
    payload = fields.get("m", fields.get(b"m"))
    if not signing.verify(_node_key(settings.COLONY_AGENT_SECRET, message.node), payload, signature):
        raise BadSignature(f"bad signature for node {message.node}")


@transaction.atomic
def register_node(message: NodeRegistered) -> Node:
    """Create or refresh a node and its GPUs; GPUs no longer reported are marked absent.

    Absent GPUs are kept rather than deleted because allocations of finished jobs point at them.
    A GPU present on another node is not taken over: the whole registration is refused
    (:class:`ForeignGpus`), so one node's key cannot shrink the cluster by claiming other nodes'
    GPUs. A GPU that really moved is registered once its old node reports it gone (or an operator
    marks it absent).
    """
    reported = {gpu.uuid: gpu for gpu in message.gpus}
    taken = list(Gpu.objects.filter(uuid__in=reported, present=True).exclude(node__name=message.node)
                 .values_list("uuid", "node__name")[:5])
    if taken:
        raise ForeignGpus("registration names GPUs of other nodes: " +
                          ", ".join(f"{uuid} (on {node})" for uuid, node in taken))
    now = timezone.now()
    node, _ = Node.objects.update_or_create(
        name=message.node,
        defaults={
            "hostname": message.hostname,
            "backend": message.backend,
            "agent_version": message.agent_version,
            "topology": [link.model_dump() for link in message.topology],
            "runtimes": sorted(set(message.runtimes)),
            "registered_at": now,
        },
    )
    if node.state != NodeState.UP:
        Node.objects.filter(pk=node.pk).update(state=NodeState.UP, state_changed_at=now)
        node.refresh_from_db()
    Gpu.objects.filter(node=node).exclude(uuid__in=reported).update(present=False)
    for uuid, info in reported.items():
        Gpu.objects.update_or_create(
            uuid=uuid,
            defaults={"node": node, "index": info.index, "model": info.model,
                      "memory_mib": info.memory_mib, "present": True},
        )
    return node


@dataclass(frozen=True)
class Inventory:
    """What the present inventory of online nodes can offer, for rejecting requests that could never
    run. A node the heartbeat lost does not count (a cordoned one does: a cordon is lifted by hand).

    All zero/empty while no node has registered (then nothing is rejected on size).
    """

    gpus_per_node: tuple[int, ...]  # descending
    largest_gpu_mib: int
    models: frozenset[str]
    # Per node: (model, memory MiB) of each present GPU.
    node_gpus: tuple[tuple[tuple[str, int], ...], ...] = ()
    # Container runtimes some node with GPUs runs image jobs with.
    runtimes: frozenset[str] = frozenset()

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)

    @property
    def most_gpus_on_a_node(self) -> int:
        return self.gpus_per_node[0] if self.gpus_per_node else 0

    def widest_nodes(self, nodes: int) -> int:
        """Most GPUs that ``nodes`` nodes hold together."""
        return sum(self.gpus_per_node[:nodes])

    def largest_mib_of(self, models) -> int:
        """Memory of the largest GPU of these models (any model when empty); 0 if none is present."""
        return max((mib for gpus in self.node_gpus for model, mib in gpus if not models or model in models),
                   default=0)

    def fitting_per_node_by_model(self, models, memory_mib: int | None) -> dict[str, tuple[int, ...]]:
        """Per GPU model, per node descending: what a gang (one model) can use."""
        return {model: tuple(sorted((sum(1 for m, mib in gpus if m == model and mib >= (memory_mib or 0))
                                     for gpus in self.node_gpus), reverse=True))
                for model in {m for gpus in self.node_gpus for m, _ in gpus if not models or m in models}}

    def fitting_per_node(self, models, memory_mib: int | None) -> tuple[int, ...]:
        """Per node, descending: GPUs of these models (any when empty) with at least ``memory_mib``."""
        return tuple(sorted((sum(1 for model, mib in gpus if (not models or model in models)
                                 and mib >= (memory_mib or 0)) for gpus in self.node_gpus), reverse=True))


def cluster_inventory() -> Inventory:
    rows = list(Gpu.objects.filter(present=True).exclude(node__state=NodeState.LOST)
                .values_list("node_id", "model", "memory_mib"))
    by_node: dict[int, list[tuple[str, int]]] = {}
    for node_id, model, memory in rows:
        by_node.setdefault(node_id, []).append((model, memory))
    node_gpus = tuple(tuple(gpus) for _, gpus in sorted(by_node.items()))
    runtimes = frozenset(runtime for listed in Node.objects.filter(pk__in=by_node).values_list("runtimes", flat=True)
                         for runtime in (listed or []))
    return Inventory(gpus_per_node=tuple(sorted((len(g) for g in node_gpus), reverse=True)),
                     largest_gpu_mib=max((mib for _, _, mib in rows), default=0),
                     models=frozenset(model for _, model, _ in rows), node_gpus=node_gpus, runtimes=runtimes)
