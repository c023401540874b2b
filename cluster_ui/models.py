"""What the site itself keeps, apart from the apps: API tokens that expire and can be revoked,
and the audit log of operators' actions. (Jobs, tenants and nodes live in their apps.)"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """A key a script or the ``colony`` command acts with (``Authorization: Token <key>``).

    Only the key's SHA-256 is stored: a copy of the database lets no one act as its users. A token
    ends at ``expires_at`` (set when it is made, at most ``COLONY_API_TOKEN_MAX_DAYS`` away) or
    when revoked, by its owner or an operator; either takes effect at the next request.
    (:mod:`cluster_ui.api_tokens` makes, checks and revokes them.)"""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    ending = models.CharField(max_length=4, editable=False, help_text="The key's last four characters.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name or 'token'} …{self.ending} of {self.user}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class AuditEvent(models.Model):
    """One action of an operator (or of a user on what is not only theirs): who, when, what, on
    which object, with the details. Written by :func:`cluster_ui.audit.record` in the action's own
    transaction; never edited (the admin shows it read-only)."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    # The actor's username when it acted: kept if the account is deleted later.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action} {self.object_repr}"
