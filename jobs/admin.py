from django.contrib import admin

from jobs.models import Allocation, Job, Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "guaranteed_gpus", "max_gpus", "weight")
    list_editable = ("guaranteed_gpus", "max_gpus", "weight")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("tenant", "role")
    search_fields = ("user__username", "tenant__slug")
    autocomplete_fields = ("user", "tenant")


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    fields = ("gpu", "created_at", "released_at")
    readonly_fields = fields
    can_delete = False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "tenant", "owner", "state", "gpus", "submitted_at", "finished_at", "exit_code")
    list_filter = ("state", "tenant")
    search_fields = ("name", "owner__username")
    list_select_related = ("tenant", "owner")
    readonly_fields = ("submitted_at", "placed_at", "started_at", "finished_at", "pending_reason", "output_tail")
    inlines = [AllocationInline]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("job", "gpu", "created_at", "released_at")
    list_select_related = ("job", "gpu__node")
    raw_id_fields = ("job", "gpu")
