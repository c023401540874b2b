"""The audit log: :func:`record` writes one :class:`cluster_ui.models.AuditEvent` for an action an
operator took (or a user took on something not only theirs). Callers record in the action's own
transaction, so an action that rolls back leaves no entry and one that commits always has one.

Who writes what: token made or revoked (:mod:`cluster_ui.api_tokens`), a user's staff or
superuser flag changed, a node cordoned or drained, another user's job cancelled by an operator,
a settings row changed in the admin (:mod:`cluster_ui.audit_hooks`). Quota changes keep their own
history (``QuotaChange``) as before. Operators read the log in the admin and at
``/api/v1/audit/`` (:mod:`cluster_ui.api.audit`); nobody else can.
"""

from __future__ import annotations

from django.db import models

from cluster_ui.models import AuditEvent


def record(actor, action: str, obj: models.Model | None = None, *, object_type: str = "", object_id="",
           object_repr: str = "", **details) -> AuditEvent:
    """One entry: ``actor`` (a user, or None for the system) did ``action`` to ``obj``."""
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
    authenticated = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEvent.objects.create(
        actor=actor if authenticated else None, actor_name=actor.get_username() if authenticated else "",
        action=action, object_type=object_type[:64], object_id=str(object_id)[:64], object_repr=object_repr[:200],
        details=details)


def jobs_cancelled(actor, jobs) -> None:
    """``actor`` cancelled ``jobs`` (rows with ``owner_id``): one entry for each that is not theirs
    (an operator's or a tenant lead's cancel of someone else's job)."""
    for job in jobs:
        if getattr(job, "owner_id", None) != getattr(actor, "pk", None):
            record(actor, "job.cancel", job, object_repr=f"job #{job.pk}"[:200], owner_id=job.owner_id)


def nodes_changed(actor, action: str, names) -> None:
    """``actor`` cordoned, uncordoned or drained the nodes ``names``."""
    for name in names:
        record(actor, action, object_type="monitoring.node", object_id=name, object_repr=name)


def from_admin_log(sender, instance, created, **_kwargs) -> None:
    """Every change made in the admin (Django's ``LogEntry``: users' staff and superuser flags,
    memberships and their roles, tenants' settings, scheduler settings ...) as an audit entry."""
    if not created:
        return
    kind = {1: "admin.add", 2: "admin.change", 3: "admin.delete"}.get(instance.action_flag, "admin.other")
    label = instance.content_type.model_class()._meta.label_lower if instance.content_type_id else ""
    if label == AuditEvent._meta.label_lower:
        return
    record(instance.user, kind, object_type=label, object_id=instance.object_id or "",
           object_repr=instance.object_repr or "", change=instance.get_change_message())
