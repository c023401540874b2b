"""Alerts as data: opened (or refreshed) when a condition is seen, resolved when it clears.

XID and thermal alerts come straight from samples here; idle-GPU and memory-over-request alerts
need to know allocations and requests, so ``jobs`` evaluates those and calls :func:`raise_alert`.

Opening and resolving send :data:`alert_opened` / :data:`alert_resolved`. ``monitoring`` does not know
who listens (``jobs`` tells operators who opted in); a listener can never break or slow the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from agents.protocol import NodeSample
from monitoring.choices import AlertKind
from monitoring.models import Alert, Gpu, Node

log = logging.getLogger(__name__)

# Sent inside the transaction that opens or resolves, with ``alert_ids``: a receiver that acts on
# the outside world defers it with transaction.on_commit, so a rolled-back alert tells nobody.
# Sent once per change, never on a refresh, so "opened" is one message however often it is re-seen.
alert_opened = Signal()
alert_resolved = Signal()


@transaction.atomic
def raise_alert(kind: str, *, node_id: int, message: str, gpu_id: int | None = None, job_id: int | None = None,
                details: dict | None = None) -> Alert:
    """Open an alert, or refresh the open one for the same kind and subject."""
    now = timezone.now()
    alert = (
        Alert.objects.select_for_update()
        .filter(kind=kind, node_id=node_id, gpu_id=gpu_id, job_id=job_id, resolved_at__isnull=True)
        .first()
    )
    if alert:
        alert.last_seen_at, alert.message, alert.details = now, message, details or {}
        alert.save(update_fields=["last_seen_at", "message", "details"])
        return alert
    alert = Alert.objects.create(kind=kind, node_id=node_id, gpu_id=gpu_id, job_id=job_id, message=message,
                                 details=details or {}, opened_at=now, last_seen_at=now)
    _announce(alert_opened, [alert.pk])
    return alert


@transaction.atomic
def resolve(kind: str, **subject) -> int:
    # Locked, so two resolvers at once announce each alert once: the second finds it resolved.
    ids = list(Alert.objects.select_for_update().filter(kind=kind, resolved_at__isnull=True, **subject)
               .values_list("pk", flat=True))
    if not ids:
        return 0
    resolved = Alert.objects.filter(pk__in=ids).update(resolved_at=timezone.now())
    _announce(alert_resolved, ids)
    return resolved


def _announce(signal: Signal, alert_ids: list[int]) -> None:
    for receiver, outcome in signal.send_robust(sender=Alert, alert_ids=alert_ids):
        if isinstance(outcome, Exception):
            log.error("alert listener %r failed for alerts %s: %r", receiver, alert_ids, outcome)


def from_samples(samples: list[NodeSample], gpu_id_of: Callable[[str, int], int | None],
                 max_temperature_c: float) -> None:
    """XID events and temperatures over the threshold; the common case touches the database 0 times."""
    for sample in samples:
        for gpu in sample.gpus:
            hot = gpu.temperature_c is not None and gpu.temperature_c > max_temperature_c
            if not (gpu.xid_events or hot):
                continue
            gpu_id = gpu_id_of(sample.node, gpu.index)
            if gpu_id is None:
                continue
            node_id = Gpu.objects.values_list("node_id", flat=True).get(pk=gpu_id)
            name = f"{sample.node}/gpu{gpu.index}"
            if gpu.xid_events:
                raise_alert(AlertKind.XID, node_id=node_id, gpu_id=gpu_id,
                            message=f"XID {', '.join(map(str, gpu.xid_events))} on {name}",
                            details={"xid": gpu.xid_events})
            if hot:
                raise_alert(AlertKind.THERMAL, node_id=node_id, gpu_id=gpu_id,
                            message=f"{name} at {gpu.temperature_c:.0f} °C (threshold {max_temperature_c:.0f} °C)",
                            details={"temperature_c": gpu.temperature_c})


def resolve_cooled(latest_gpus: dict[str, dict] | Callable[[], dict[str, dict]], max_temperature_c: float) -> int:
    """Resolve thermal alerts of GPUs whose latest reading is back under the threshold.
    ``latest_gpus``: the readings by "node:index", or what reads them, called only while a thermal
    alert is open (reading a thousand nodes' samples to resolve none cost most of an evaluation)."""
    resolved = 0
    open_alerts = list(Alert.objects.filter(kind=AlertKind.THERMAL, resolved_at__isnull=True)
                       .select_related("gpu__node"))
    if open_alerts and callable(latest_gpus):
        latest_gpus = latest_gpus()
    for alert in open_alerts:
        reading = latest_gpus.get(f"{alert.gpu.node.name}:{alert.gpu.index}")
        if reading and reading.get("temperature_c") is not None and reading["temperature_c"] <= max_temperature_c:
            resolved += resolve(AlertKind.THERMAL, pk=alert.pk)
    return resolved


def node_lost(node: Node) -> Alert:
    return raise_alert(AlertKind.NODE_LOST, node_id=node.pk, message=f"Node {node.name} stopped heartbeating")
