"""The operators' admin for tenants (quotas, members, usage, audit trail of quota changes), jobs
(cancel, requeue, resubmit), allocations, job profiles (inspect, correct or delete to reset), and
the nodes admin's drain-now (it moves jobs)."""

from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery, Sum
from django.utils.html import format_html

from cluster_ui import audit
from jobs.choices import TERMINAL_STATES, RunClass, JobState
from jobs.models import Allocation, Job, JobProfile, JobPromise, Membership, QuotaChange, Tenant
from jobs.services.submission import NotCancellable, NotRequeueable, cancel_job, requeue_job, submit_job
from monitoring.admin import NodeAdmin
from monitoring.models import Node

# Tenant policy an operator's edit of which is audited (QuotaChange): quota, GPU sharing, idle policy.
QUOTA_FIELDS = ("guaranteed_gpus", "max_gpus", "weight", "unfenced_sharing", "idle_notify_minutes",
                "idle_opportunistic_minutes", "idle_suspend_minutes", "idle_requeue_minutes", "idle_util_percent")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


class QuotaChangeInline(admin.TabularInline):
    """The audit trail, newest first: who changed which quota field, when, from what to what."""

    model = QuotaChange
    extra = 0
    fields = ("changed_at", "changed_by", "field", "old_value", "new_value")
    readonly_fields = fields
    can_delete = False
    verbose_name_plural = "Quota changes (audit trail)"
    max_num = 0  # no "add another": rows are written by save_model only

    def has_add_permission(self, request, obj=None):
        return False


def _held_milli(*, opportunistic: bool) -> Subquery:
    """Milli-GPUs a tenant's jobs hold now, borrowed (opportunistic) or within the guarantee."""
    held = Allocation.objects.filter(job__tenant=OuterRef("pk"), released_at__isnull=True)
    if opportunistic:
        held = held.filter(job__run_class=RunClass.OPPORTUNISTIC)
    else:
        held = held.exclude(job__run_class=RunClass.OPPORTUNISTIC)
    return Subquery(held.values("job__tenant").annotate(milli=Sum("gpu_milli")).values("milli")[:1])


def record_quota_changes(request, tenant: Tenant, form) -> list[QuotaChange]:
    """One QuotaChange per quota field the form changed (change form and list_editable alike)."""
    if tenant.pk is None:
        return []
    changes = []
    for field in QUOTA_FIELDS:
        if field not in form.changed_data:
            continue
        old, new = form.initial.get(field), form.cleaned_data.get(field)
        if old == new:
            continue
        changes.append(QuotaChange(tenant=tenant, changed_by=request.user, field=field,
                                   old_value=str(old), new_value=str(new)))
    return QuotaChange.objects.bulk_create(changes)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "guaranteed_gpus", "max_gpus", "weight", "unfenced_sharing", "usage", "members")
    list_editable = ("guaranteed_gpus", "max_gpus", "weight")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("usage", "decayed_usage", "usage_updated_at")
    fieldsets = (
        (None, {"fields": ("name", "slug")}),
        ("Quota", {"fields": ("guaranteed_gpus", "max_gpus", "weight"),
                   "description": "Changes are recorded in the audit trail below."}),
        ("GPU sharing", {"fields": ("unfenced_sharing",),
                         "description": "Whether its jobs may share a GPU whose node enforces no memory or compute "
                                        "limits (isolation 'unfenced': no MPS, driver memory limit or MIG). There a "
                                        "neighbour that allocates past its share can make a job run out of memory; "
                                        "the scheduler's memory-pressure preemption is the only guard. A job's own "
                                        "accepts_unfenced overrides this."}),
        ("Usage", {"fields": ("usage", "decayed_usage", "usage_updated_at")}),
        ("Idle GPUs", {"fields": ("idle_notify_minutes", "idle_opportunistic_minutes", "idle_suspend_minutes",
                                  "idle_requeue_minutes", "idle_util_percent"),
                       "description": "Minutes a running job's GPUs have all been idle before each step; empty "
                                      "turns a step off (all empty: no policy). A suspended job keeps its GPU "
                                      "memory until it is requeued."}),
    )
    inlines = [MembershipInline, QuotaChangeInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            guaranteed_milli=_held_milli(opportunistic=False),
            borrowed_milli=_held_milli(opportunistic=True),
            member_count=Subquery(
                Membership.objects.filter(tenant=OuterRef("pk")).values("tenant")
                .annotate(n=Count("pk")).values("n")[:1]
            ),
        )

    @admin.display(description="In use (guaranteed + borrowed) / guarantee / ceiling")
    def usage(self, tenant):
        if tenant.pk is None or not hasattr(tenant, "guaranteed_milli"):
            return "—"
        guaranteed = (tenant.guaranteed_milli or 0) / 1000
        borrowed = (tenant.borrowed_milli or 0) / 1000
        ceiling = max(tenant.max_gpus, guaranteed + borrowed, 1)
        guaranteed_pct = 100 * guaranteed / ceiling
        borrowed_pct = 100 * borrowed / ceiling
        quota_pct = 100 * tenant.guaranteed_gpus / ceiling
        return format_html(
            '<div style="position:relative;width:160px;height:10px;background:#eef0f4;border-radius:3px;'
            'display:inline-block;vertical-align:middle;margin-right:8px">'
            '<span style="position:absolute;left:0;top:0;bottom:0;width:{}%;background:#2f6fde"></span>'
            '<span style="position:absolute;left:{}%;top:0;bottom:0;width:{}%;background:#e07b39"></span>'
            '<span style="position:absolute;left:{}%;top:-2px;bottom:-2px;width:2px;background:#1d2330"></span>'
            "</div>{} + {} / {} / {} GPUs",
            f"{guaranteed_pct:.1f}", f"{guaranteed_pct:.1f}", f"{borrowed_pct:.1f}", f"{quota_pct:.1f}",
            f"{guaranteed:g}", f"{borrowed:g}",
            tenant.guaranteed_gpus, tenant.max_gpus,
        )

    @admin.display(description="Members", ordering="member_count")
    def members(self, tenant):
        return getattr(tenant, "member_count", None) or 0

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            record_quota_changes(request, obj, form)


@admin.register(QuotaChange)
class QuotaChangeAdmin(admin.ModelAdmin):
    list_display = ("changed_at", "tenant", "field", "old_value", "new_value", "changed_by")
    list_filter = ("tenant", "field")
    list_select_related = ("tenant", "changed_by")
    date_hierarchy = "changed_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("tenant", "role")
    search_fields = ("user__username", "tenant__slug")
    autocomplete_fields = ("user", "tenant")


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    fields = ("gpu", "gpu_milli", "memory_limit_mib", "duty_cycle", "rank", "created_at", "released_at")
    readonly_fields = fields
    can_delete = False


SPEC_FIELDS = ("gpu_milli", "gpu_memory_mib", "gpu_models", "priority", "opportunistic_only", "shareable",
               "max_nodes", "max_runtime_s", "profile_key", "mig_profile", "accepts_unfenced")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "tenant", "owner", "state", "run_class", "gpus", "submitted_at", "finished_at",
                    "exit_code")
    list_filter = ("state", "run_class", "tenant")
    search_fields = ("name", "owner__username")
    list_select_related = ("tenant", "owner")
    # The state moves only through the lifecycle (jobs/state_guard.py): by the actions below, not the form.
    readonly_fields = ("state", "submitted_at", "placed_at", "started_at", "finished_at", "pending_reason",
                       "promised_gpus", "output_tail")

    @admin.display(description="Promised GPUs")
    def promised_gpus(self, job: Job):
        """The GPUs a reclaim freed for it, while it waits for them (``JobPromise``)."""
        promise = JobPromise.objects.filter(job=job).first()
        return promise.gpu_ids if promise else "-"
    inlines = [AllocationInline]
    actions = ["cancel_jobs", "requeue_jobs", "resubmit_jobs"]

    @admin.action(description="Cancel selected jobs (running ones are stopped on their nodes)")
    def cancel_jobs(self, request, queryset):
        done, refused = 0, []
        for job in queryset:
            try:
                cancel_job(job)
                audit.jobs_cancelled(request.user, [job])
                done += 1
            except NotCancellable as exc:
                refused.append(str(exc))
        if done:
            self.message_user(request, f"Cancelled or stopping {done} job(s).", messages.SUCCESS)
        if refused:
            self.message_user(request, "Not cancelled: " + "; ".join(refused), messages.WARNING)

    @admin.action(description="Requeue selected running jobs (stopped on their nodes, then placed again)")
    def requeue_jobs(self, request, queryset):
        done, refused = 0, []
        for job in queryset:
            try:
                requeue_job(job, by=request.user.get_username())
                done += 1
            except NotRequeueable as exc:
                refused.append(str(exc))
        if done:
            self.message_user(request, f"Requeueing {done} job(s): they are stopped, then queued again.",
                              messages.SUCCESS)
        if refused:
            self.message_user(request, "Not requeued: " + "; ".join(refused), messages.WARNING)

    @admin.action(description="Resubmit selected finished jobs as new pending jobs")
    def resubmit_jobs(self, request, queryset):
        created, skipped = [], 0
        for job in queryset.select_related("tenant", "owner"):
            if job.state not in TERMINAL_STATES:
                skipped += 1
                continue
            copy = submit_job(owner=job.owner, tenant=job.tenant, name=job.name, command=job.command, gpus=job.gpus,
                              **{field: getattr(job, field) for field in SPEC_FIELDS})
            created.append(f"#{job.pk} → #{copy.pk}")
        if created:
            self.message_user(request, "Resubmitted " + ", ".join(created) + ".", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} job(s) skipped: only finished jobs can be resubmitted.",
                              messages.WARNING)


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("job", "gpu", "gpu_milli", "duty_cycle", "created_at", "released_at")
    list_select_related = ("job", "gpu__node")
    raw_id_fields = ("job", "gpu")


@admin.register(JobProfile)
class JobProfileAdmin(admin.ModelAdmin):
    """What later jobs with a key are placed from. Deleting a profile resets it: the key's next
    successful run records a fresh one (and its jobs are placed from their request meanwhile)."""

    list_display = ("tenant", "key", "runs", "peak_gpu_memory_mib", "mean_util", "mean_runtime_s", "updated_at")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    search_fields = ("key", "tenant__slug")


class NodeWithJobsAdmin(NodeAdmin):
    """The nodes admin (``monitoring``) plus what needs jobs: a drain that moves running work off."""

    actions = [*NodeAdmin.actions, "drain_now"]

    # Each node action is written to the audit log (cluster_ui/audit.py; monitoring may not import it).
    @admin.action(description="Cordon selected nodes (no new jobs)")
    def cordon(self, request, queryset):
        audit.nodes_changed(request.user, "node.cordon", queryset.filter(cordoned=False).values_list("name", flat=True))
        super().cordon(request, queryset)

    @admin.action(description="Uncordon selected nodes")
    def uncordon(self, request, queryset):
        audit.nodes_changed(request.user, "node.uncordon",
                            queryset.filter(cordoned=True).values_list("name", flat=True))
        super().uncordon(request, queryset)

    @admin.action(description="Drain selected nodes (cordon; running jobs finish on their own)")
    def drain(self, request, queryset):
        audit.nodes_changed(request.user, "node.drain", queryset.values_list("name", flat=True))
        super().drain(request, queryset)

    @admin.action(description="Drain now: cordon, and requeue the jobs running there (stopped, placed elsewhere)")
    def drain_now(self, request, queryset):
        names = list(queryset.values_list("name", flat=True))
        queryset.update(cordoned=True)
        audit.nodes_changed(request.user, "node.drain_now", names)
        jobs = Job.objects.filter(
            allocations__gpu__node__name__in=names, allocations__released_at__isnull=True,
            state__in=(JobState.PLACED, JobState.RUNNING),
        ).distinct()
        requeued = []
        for job in jobs:
            try:
                requeue_job(job, by=request.user.get_username())
                requeued.append(f"#{job.pk}")
            except NotRequeueable:
                pass  # it ended meanwhile
        self.message_user(
            request, f"Draining {', '.join(names)}: cordoned; requeued {len(requeued)} running job(s)"
                     + (f" ({', '.join(requeued)})" if requeued else "") + ". The nodes are empty once they stop.",
            messages.SUCCESS,
        )


admin.site.unregister(Node)
admin.site.register(Node, NodeWithJobsAdmin)
