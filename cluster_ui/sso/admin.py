from django.contrib import admin

from cluster_ui.sso.models import OidcIdentity


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Read-only: identities are made and kept in line by sign-ins, their groups by the IdP."""

    list_display = ("user", "subject", "issuer", "groups", "last_login_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "groups", "last_login_at")

    def has_add_permission(self, request):
        return False
