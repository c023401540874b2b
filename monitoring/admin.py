from django.contrib import admin

from django.utils import timezone

from monitoring.models import Alert, Gpu, JobUsage, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "model", "memory_mib", "uuid", "present")
    readonly_fields = fields
    can_delete = False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "hostname", "backend", "gpu_count", "cordoned", "rack", "registered_at",
                    "agent_version")
    list_filter = ("state", "cordoned", "backend")
    search_fields = ("name", "hostname")
    readonly_fields = ("registered_at", "state", "state_changed_at", "topology")
    inlines = [GpuInline]

    @admin.display(description="GPUs")
    def gpu_count(self, node):
        return node.gpus.filter(present=True).count()


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model", "memory_mib", "uuid", "present")
    list_filter = ("model", "present", "node")
    search_fields = ("uuid", "node__name")
    list_select_related = ("node",)


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("message", "kind", "node", "gpu", "job_id", "opened_at", "last_seen_at", "resolved_at")
    list_filter = ("kind", ("resolved_at", admin.EmptyFieldListFilter), "node")
    list_select_related = ("node", "gpu__node")
    search_fields = ("message",)
    actions = ["resolve"]

    @admin.action(description="Mark selected alerts resolved")
    def resolve(self, request, queryset):
        queryset.filter(resolved_at__isnull=True).update(resolved_at=timezone.now())


@admin.register(JobUsage)
class JobUsageAdmin(admin.ModelAdmin):
    list_display = ("job_id", "peak_gpu_memory_mib", "mean_util", "first_seen_at", "last_seen_at")
    search_fields = ("job_id",)
