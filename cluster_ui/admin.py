"""Admin pages of the site's own models: API tokens (revoke from here, anyone's) and the audit
log (read-only: nobody edits or deletes what happened)."""

from django.contrib import admin, messages

from cluster_ui import api_tokens
from cluster_ui.models import ApiToken, AuditEvent


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "ending", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "name"]
    readonly_fields = ["user", "name", "ending", "created_at", "expires_at", "last_used_at", "revoked_at",
                       "revoked_by"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # made by their owner (Account > API tokens), whose key is shown only to them

    @admin.action(description="Revoke selected tokens (they stop working at once)")
    def revoke(self, request, queryset):
        revoked = sum(api_tokens.revoke(token, request.user) for token in queryset.select_related("user"))
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor_name", "action", "object_type", "object_repr"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_name", "object_repr", "object_id"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
