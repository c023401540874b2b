"""The audit log through the API (``/api/v1/audit/``), for operators only: newest first,
paginated (anyone else: 404), filtered by ``?action=``, ``?actor=`` (username) and ``?since=`` (ISO time)."""

from __future__ import annotations

from django.utils.dateparse import parse_datetime
from rest_framework import exceptions, generics, permissions, serializers

from cluster_ui import api_tokens
from cluster_ui.models import AuditEvent


class IsOperator(permissions.BasePermission):
    def has_permission(self, request, view):
        if request.user and request.user.is_authenticated and api_tokens.is_operator(request.user):
            return True
        # As the API answers for what a user may not see (cluster_ui/api/tenancy.py): not found.
        raise exceptions.NotFound("No audit log here: it is for operators.")


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "object_type", "object_id", "object_repr", "details"]


class AuditEventListView(generics.ListAPIView):
    """Operators' actions: who did what to which object, when (operators only)."""

    serializer_class = AuditEventSerializer
    permission_classes = [permissions.IsAuthenticated, IsOperator]

    def get_queryset(self):
        events = AuditEvent.objects.all()
        params = self.request.query_params
        if params.get("action"):
            events = events.filter(action=params["action"])
        if params.get("actor"):
            events = events.filter(actor_name=params["actor"])
        since = parse_datetime(params.get("since") or "")
        if since is not None:
            events = events.filter(at__gte=since)
        return events
