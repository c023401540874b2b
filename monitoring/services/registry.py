"""Who the nodes are: agent authentication, and registrations from agents -> Node and Gpu rows;
the inventory facts that submission checks read (:func:`cluster_inventory`, cached per process).

Every reader of what agents write (metric ingest, agent events) calls :func:`authenticate` on each
parsed message before applying anything: under ``COLONY_AGENT_AUTH=required`` a message must be
signed with the key of the node it names (:mod:`agents.signing`), or it is rejected.

Whoever changes what the inventory offers (a node registers, is marked lost or comes back, a GPU
is added, removed or marked absent) calls :func:`inventory_changed` in the same transaction. Saves
and deletes of Node and Gpu rows (the admin, factories) do so through signals; ``QuerySet.update``
and ``bulk_create`` send none, so their callers must call it themselves.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from django.conf import settings
import redis
from django.db import connection, transaction
from django.db.models import Count, Max
from django.db.models.signals import post_delete, post_migrate, post_save
from django.utils import timezone

from agents import protocol, signing
from agents.protocol import NodeRegistered
from monitoring.choices import AlertKind, NodeHealth
from monitoring.models import Alert, Gpu, Node
from monitoring.services.redis_client import get_redis

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
def register_node(message: NodeRegistered, *, revive: bool = True) -> Node:
    """Create or refresh a node and its GPUs; GPUs no longer reported are marked absent.

    Absent GPUs are kept rather than deleted because allocations of finished jobs point at them.
    A GPU present on another node is not taken over: the whole registration is refused
    (:class:`ForeignGpus`), so one node's key cannot shrink the cluster by claiming other nodes'
    GPUs. A GPU that really moved is registered once its old node reports it gone (or an operator
    marks it absent).

    A LOST node comes back UP unless ``revive`` is False: the caller says so when the node still
    runs jobs it no longer holds (``health.revive_heartbeating`` brings it back once they stopped).
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
            "cpu_milli": message.cpu_milli,
            "host_memory_mib": message.host_memory_mib,
            "job_fences": job_fences(message),
            "registered_at": now,
        },
    )
    if node.state != NodeHealth.UP and revive:
        Node.objects.filter(pk=node.pk).update(state=NodeHealth.UP, state_changed_at=now)
        node.refresh_from_db()
    Gpu.objects.filter(node=node).exclude(uuid__in=reported).update(present=False)
    for gpu_uuid, info in reported.items():
        Gpu.objects.update_or_create(
            uuid=gpu_uuid,
            defaults={"node": node, "index": info.index, "model": info.model,
                      "memory_mib": info.memory_mib, "present": True, "isolation": info.isolation,
                      "mig_profile": info.mig_profile, "parent_index": info.parent_index},
        )
    inventory_changed()
    return node


def job_fences(message: NodeRegistered) -> list[str] | None:
    """The fences the registration reports, in :data:`agents.protocol.JOB_FENCES` order; None
    when its agent predates the field (a message without it), which is not "no fences"."""
    if "job_fences" not in message.model_fields_set:
        return None
    return [fence for fence in protocol.JOB_FENCES if fence in message.job_fences]


@dataclass(frozen=True)
class Inventory:
    """What the present inventory of online nodes can offer, for rejecting requests that could never
    run. A node the heartbeat lost does not count (a cordoned one does: a cordon is lifted by hand).

    All zero/empty while no node has registered (then nothing is rejected on size).

    Held per distinct node composition rather than per GPU, and each answer kept once computed: a
    submission must cost the same at 16,384 GPUs as at 8 (clusters are a few kinds of node).
    """

    # Each distinct composition ((model, memory MiB, GPUs), ...) with how many nodes have it.
    node_kinds: tuple[tuple[tuple[tuple[str, int, int], ...], int], ...] = ()
    # Container runtimes some node with GPUs runs image jobs with.
    runtimes: frozenset[str] = frozenset()
    # MIG instances are not in ``node_kinds`` (only a job asking for its profile may run on one):
    # each profile some online node has, with the memory of its largest instance, by profile.
    mig_profiles: tuple[tuple[str, int], ...] = ()
    # CPU (milli-cores) and host memory (MiB) the nodes with GPUs (or MIG instances) offer: the largest on one node and
    # the sum; None while some node does not report it (it is then unlimited there).
    largest_cpu_milli: int | None = None
    total_cpu_milli: int | None = None
    largest_host_memory_mib: int | None = None
    total_host_memory_mib: int | None = None
    gpus_per_node: tuple[int, ...] = field(init=False)  # descending
    largest_gpu_mib: int = field(init=False)
    models: frozenset[str] = field(init=False)
    total_gpus: int = field(init=False)
    _answers: dict = field(init=False, default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        per_node = sorted((sum(n for _, _, n in kind) for kind, nodes in self.node_kinds for _ in range(nodes)),
                          reverse=True)
        object.__setattr__(self, "gpus_per_node", tuple(per_node))
        object.__setattr__(self, "total_gpus", sum(per_node))
        object.__setattr__(self, "largest_gpu_mib", max((mib for kind, _ in self.node_kinds for _, mib, _ in kind),
                                                        default=0))
        object.__setattr__(self, "models", frozenset(model for kind, _ in self.node_kinds for model, _, _ in kind))

    @property
    def registered(self) -> bool:
        """Some device is present: until then nothing is refused on size (the job waits)."""
        return bool(self.total_gpus or self.mig_profiles)

    def largest_mig_mib(self, profile: str) -> int | None:
        """Memory of the largest present MIG instance of ``profile``; None when no node has one."""
        return dict(self.mig_profiles).get(profile)

    @property
    def most_gpus_on_a_node(self) -> int:
        return self.gpus_per_node[0] if self.gpus_per_node else 0

    def widest_nodes(self, nodes: int) -> int:
        """Most GPUs that ``nodes`` nodes hold together."""
        return sum(self.gpus_per_node[:nodes])

    def _answer(self, question: str, models, memory_mib: int | None, compute):
        key = (question, frozenset(models or ()), memory_mib or 0)
        try:
            return self._answers[key]
        except KeyError:
            pass
        if len(self._answers) >= MAX_REMEMBERED_ANSWERS:  # requests are few shapes; a client cycling sizes is not
            self._answers.clear()
        answer = self._answers[key] = compute(key[1], key[2])
        return answer

    def largest_mib_of(self, models) -> int:
        """Memory of the largest GPU of these models (any model when empty); 0 if none is present."""
        return self._answer("largest", models, None, lambda models, _: max(
            (mib for kind, _ in self.node_kinds for model, mib, _ in kind if not models or model in models),
            default=0))

    def fitting_per_node_by_model(self, models, memory_mib: int | None) -> dict[str, tuple[int, ...]]:
        """Per GPU model, per node descending: what a gang (one model) can use."""
        def compute(models, memory):
            wanted = {m for kind, _ in self.node_kinds for m, _, _ in kind if not models or m in models}
            return {model: self._per_node(lambda m, mib: m == model and mib >= memory) for model in wanted}
        return self._answer("by_model", models, memory_mib, compute)

    def fitting_per_node(self, models, memory_mib: int | None) -> tuple[int, ...]:
        """Per node, descending: GPUs of these models (any when empty) with at least ``memory_mib``."""
        return self._answer("per_node", models, memory_mib, lambda models, memory: self._per_node(
            lambda m, mib: (not models or m in models) and mib >= memory))

    def _per_node(self, fits) -> tuple[int, ...]:
        return tuple(sorted((sum(n for model, mib, n in kind if fits(model, mib))
                             for kind, nodes in self.node_kinds for _ in range(nodes)), reverse=True))


MAX_REMEMBERED_ANSWERS = 4096
INVENTORY_VERSION_KEY = "colony:inventory:version"
# A backstop for writers that change the inventory without saying so (QuerySet.update sends no
# signal): each process rereads it at least this often.
INVENTORY_MAX_AGE_S = 10.0

# (version, when loaded (monotonic), inventory) of this process.
_memo: tuple[bytes, float, Inventory] | None = None
_memo_lock = threading.Lock()
_warned_uncached = threading.Event()


def present_gpu_groups() -> list[tuple[int, str, int, int]]:
    """(node id, model, memory MiB, GPUs) of the present whole GPUs (not MIG instances) of online
    nodes: one row per group."""
    # order_by(): the default ordering (node name, GPU index) would join nodes and, in a DISTINCT
    # or GROUP BY, split the groups back into one row per GPU.
    return list(_present_devices().filter(mig_profile__isnull=True)
                .values_list("node_id", "model", "memory_mib").annotate(gpus=Count("pk")))


def present_mig_groups() -> list[tuple[int, str, int]]:
    """(node id, profile, memory MiB of its largest instance there) of the MIG instances present on
    online nodes: one row per node and profile."""
    return list(_present_devices().filter(mig_profile__isnull=False)
                .values_list("node_id", "mig_profile").annotate(largest=Max("memory_mib")))


def _present_devices():
    return Gpu.objects.filter(present=True).exclude(node__state=NodeHealth.LOST).order_by()


def load_inventory() -> Inventory:
    """The inventory as the database has it now (uncached)."""
    by_node: dict[int, list[tuple[str, int, int]]] = {}
    for node_id, model, memory, gpus in present_gpu_groups():
        by_node.setdefault(node_id, []).append((model, memory, gpus))
    kinds = Counter(tuple(sorted(groups)) for groups in by_node.values())
    mig: dict[str, int] = {}
    mig_nodes = set()
    for node_id, profile, memory in present_mig_groups():
        mig[profile] = max(memory, mig.get(profile, 0))
        mig_nodes.add(node_id)
    nodes = [row for row in Node.objects.order_by().values_list("pk", "runtimes", "cpu_milli", "host_memory_mib")
             if row[0] in by_node or row[0] in mig_nodes]
    runtimes = frozenset(runtime for _, listed, _, _ in nodes for runtime in (listed or []))
    cpus = [cpu for _, _, cpu, _ in nodes]
    memories = [mib for _, _, _, mib in nodes]
    reported = lambda values: bool(values) and None not in values  # noqa: E731
    return Inventory(node_kinds=tuple(sorted(kinds.items())), runtimes=runtimes,
                     mig_profiles=tuple(sorted(mig.items())),
                     largest_cpu_milli=max(cpus) if reported(cpus) else None,
                     total_cpu_milli=sum(cpus) if reported(cpus) else None,
                     largest_host_memory_mib=max(memories) if reported(memories) else None,
                     total_host_memory_mib=sum(memories) if reported(memories) else None)


def cluster_inventory() -> Inventory:
    """The inventory, as of the last :func:`inventory_changed` (at most ``INVENTORY_MAX_AGE_S`` old)
    for this process; costs one Redis GET while nothing changes."""
    global _memo
    if connection.in_atomic_block:
        # What this transaction sees may include its own writes, which may yet roll back.
        return load_inventory()
    try:
        version = _inventory_version()
    except (redis.RedisError, OSError) as exc:
        if not _warned_uncached.is_set():
            _warned_uncached.set()
            log.warning("inventory version unreadable (%s): reading the inventory from the database on every "
                        "call until Redis answers", exc)
        return load_inventory()
    memo = _memo
    if memo is not None and memo[0] == version and time.monotonic() - memo[1] < INVENTORY_MAX_AGE_S:
        return memo[2]
    with _memo_lock:  # one thread of this process loads it; the others wait for that
        memo = _memo
        if memo is not None and memo[0] == version and time.monotonic() - memo[1] < INVENTORY_MAX_AGE_S:
            return memo[2]
        # Loaded after the version was read: a change committed meanwhile bumps it again, so the
        # worst a race leaves is one stale load that the next read replaces.
        loaded_at = time.monotonic()
        inventory = load_inventory()
        _memo = (version, loaded_at, inventory)
        return inventory


def _inventory_version() -> bytes:
    client = get_redis()
    version = client.get(INVENTORY_VERSION_KEY)
    if version is None:
        # Redis restarted empty (or was never told): what any process holds may predate that, and
        # a fresh random version (not a counter that restarts at 1) makes every one of them reload.
        client.set(INVENTORY_VERSION_KEY, uuid.uuid4().hex, nx=True)
        version = client.get(INVENTORY_VERSION_KEY)
    return version


def inventory_changed() -> None:
    """Make every process reload the inventory once the current transaction commits (at once
    outside one). Before the commit a reload could read the old rows and keep them."""
    # Once per transaction: deleting a node sends a signal per GPU.
    if connection.in_atomic_block and any(func is _bump_version for _, func, _ in connection.run_on_commit):
        return
    transaction.on_commit(_bump_version)


def _bump_version() -> None:
    try:
        get_redis().set(INVENTORY_VERSION_KEY, uuid.uuid4().hex)
    except (redis.RedisError, OSError) as exc:
        # Processes see the change within INVENTORY_MAX_AGE_S anyway.
        log.warning("could not announce an inventory change: %s", exc)


def _on_inventory_row_saved(sender, **kwargs) -> None:
    inventory_changed()


def _on_alert_saved(sender, instance, **kwargs) -> None:
    # A node is marked lost with QuerySet.update (monitoring.services.health), which sends no
    # signal; the node-lost alert raised in the same transaction (jobs.services.node_health) does.
    if instance.kind == AlertKind.NODE_LOST:
        inventory_changed()


def _on_flush_or_migrate(**kwargs) -> None:
    # flush and migrations rewrite rows without per-row signals.
    inventory_changed()


for _model in (Node, Gpu):
    post_save.connect(_on_inventory_row_saved, sender=_model, dispatch_uid=f"inventory-{_model.__name__}-saved")
    post_delete.connect(_on_inventory_row_saved, sender=_model, dispatch_uid=f"inventory-{_model.__name__}-deleted")
post_save.connect(_on_alert_saved, sender=Alert, dispatch_uid="inventory-node-lost-alert")
post_migrate.connect(_on_flush_or_migrate, dispatch_uid="inventory-flush-or-migrate")
