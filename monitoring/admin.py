"""The operators' admin for nodes (cordon, uncordon, drain), GPUs, alerts and job usage."""

from django.contrib import admin, messages
from django.db.models import Count, Q
from django.utils import timezone

from monitoring.models import Alert, Gpu, JobUsage, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "model", "memory_mib", "isolation", "mig_profile", "parent_index", "uuid", "present")
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
    actions = ["cordon", "uncordon", "drain"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(present_gpus=Count("gpus", filter=Q(gpus__present=True)))

    @admin.display(description="GPUs", ordering="present_gpus")
    def gpu_count(self, node):
        return getattr(node, "present_gpus", None)

    @admin.action(description="Cordon selected nodes (no new jobs)")
    def cordon(self, request, queryset):
        changed = queryset.filter(cordoned=False).update(cordoned=True)
        self.message_user(request, f"Cordoned {changed} node(s): the scheduler places no new jobs there; "
                                   "running jobs continue.", messages.SUCCESS)

    @admin.action(description="Uncordon selected nodes")
    def uncordon(self, request, queryset):
        changed = queryset.filter(cordoned=True).update(cordoned=False)
        self.message_user(request, f"Uncordoned {changed} node(s): they take new jobs again.", messages.SUCCESS)

    @admin.action(description="Drain selected nodes (cordon; running jobs finish on their own)")
    def drain(self, request, queryset):
        names = list(queryset.values_list("name", flat=True))
        queryset.update(cordoned=True)
        # Moving the jobs still running there is the jobs app's business: its "drain now" action
        # (jobs/admin.py) extends this admin; monitoring never imports jobs.
        self.message_user(
            request,
            f"Draining {', '.join(names)}: cordoned, so no new jobs land there. Jobs already running keep "
            f"running until they finish; 'Drain now' requeues them to free the node sooner.",
            messages.WARNING,
        )


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model", "memory_mib", "isolation", "mig_profile", "uuid", "present")
    list_filter = ("model", "isolation", "present", "node")
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
