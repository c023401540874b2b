from django.contrib import admin

from monitoring.models import Gpu, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "model", "memory_mib", "uuid", "present")
    readonly_fields = fields
    can_delete = False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "backend", "gpu_count", "cordoned", "registered_at", "agent_version")
    list_filter = ("cordoned", "backend")
    search_fields = ("name", "hostname")
    readonly_fields = ("registered_at",)
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
