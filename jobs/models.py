"""Tenants and their members, jobs and the GPUs allocated to them."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from jobs.choices import ACTIVE_STATES, JobClass, JobEventKind, JobState, Role


class Tenant(models.Model):
    """A team sharing the cluster, with a guaranteed share and a borrowing ceiling."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    guaranteed_gpus = models.PositiveIntegerField(default=0, help_text="GPUs the tenant is owed.")
    max_gpus = models.PositiveIntegerField(default=0, help_text="Borrowing ceiling, guaranteed included.")
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01)],
                               help_text="Share of spare capacity relative to other tenants.")
    # GPU-seconds of recent use, decayed with a half-life: the fair-share order of borrowers.
    decayed_usage = models.FloatField(default=0.0)
    usage_updated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(max_gpus__gte=F("guaranteed_gpus")), name="tenant_max_at_least_guaranteed"),
            models.CheckConstraint(condition=Q(weight__gt=0), name="tenant_weight_positive"),
        ]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.RESEARCHER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}"


class JobQuerySet(models.QuerySet):
    def visible_to(self, user) -> "JobQuerySet":
        """The one tenancy filter: members see their tenants' jobs, staff see all, others none.

        Every page and API view starts from this, so no endpoint writes its own filter.
        """
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self
        return self.filter(tenant__memberships__user=user)

    def active(self) -> "JobQuerySet":
        return self.filter(state__in=ACTIVE_STATES)


class Job(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.JSONField(help_text="argv list; run without a shell.")
    env = models.JSONField(default=dict, blank=True, help_text="Extra environment variables for the job.")
    gpus = models.PositiveSmallIntegerField()
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True, help_text="Memory needed per GPU.")
    gpu_milli = models.PositiveSmallIntegerField(
        default=1000, validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of one GPU in thousandths (below 1000 only with 1 GPU); fractional jobs share GPUs.",
    )
    gpu_models = models.JSONField(default=list, blank=True, help_text="Allowed GPU models; empty means any.")
    priority = models.SmallIntegerField(default=0)
    opportunistic_only = models.BooleanField(default=False, help_text="Never run as guaranteed (cheap, preemptible).")
    shareable = models.BooleanField(default=False, help_text="A guaranteed job that accepts GPU neighbours.")
    max_nodes = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Gang spread limit; empty = any.")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, help_text="Stopped when exceeded.")
    profile_key = models.CharField(max_length=200, blank=True,
                                   help_text="Jobs with the same key are placed from the recorded profile.")

    run_class = models.CharField(max_length=16, choices=JobClass.choices, blank=True,
                                 help_text="How it was admitted when placed.")
    reserved_since = models.DateTimeField(null=True, blank=True, help_text="When its gang reservation began.")
    preempt_count = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveIntegerField(
        default=0, help_text="Placements so far; the current one's launch command is launch-<id>-<attempt>.")
    eta_first_at = models.DateTimeField(null=True, blank=True,
                                        help_text="The first start time the scheduler predicted for it.")
    eta_error_s = models.FloatField(null=True, blank=True,
                                    help_text="First placement minus the first predicted start; + is late.")

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    pending_reason = models.JSONField(null=True, blank=True, help_text="{code, message, details} while pending.")
    requeue_count = models.PositiveSmallIntegerField(default=0, help_text="Times its node was lost under it.")
    peak_gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True,
                                                      help_text="Most GPU memory seen on any of its GPUs.")
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    output_tail = models.TextField(blank=True)

    submitted_at = models.DateTimeField(auto_now_add=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["tenant", "state"], name="job_tenant_state"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_positive"),
            models.CheckConstraint(condition=Q(gpu_milli=1000) | Q(gpus=1), name="job_fraction_only_single_gpu"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"


class Allocation(models.Model):
    """A GPU held by a job, from placement until the agent reports the job's processes gone."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("monitoring.Gpu", on_delete=models.PROTECT, related_name="allocations")
    memory_limit_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_milli = models.PositiveSmallIntegerField(default=1000)
    duty_cycle = models.FloatField(default=1.0, help_text="Share of time it may run (throttling).")
    rank = models.PositiveSmallIntegerField(default=0, help_text="Node rank in a multi-node gang.")
    attempt = models.PositiveIntegerField(default=0, help_text="The job's attempt (placement) it was made for.")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "released_at"], name="allocation_gpu_live")]

    def __str__(self) -> str:
        return f"{self.job} on {self.gpu}"


class JobEvent(models.Model):
    """One step of a job's life, per attempt: what researchers read as its timeline (placed,
    started, stopped and why, back in the queue, finished). Written only by
    :mod:`jobs.services.lifecycle`, in the same transaction as the state change it records."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.PositiveIntegerField(default=0, help_text="0 before the first placement.")
    kind = models.CharField(max_length=16, choices=JobEventKind.choices)
    at = models.DateTimeField()
    node = models.CharField(max_length=63, blank=True)
    message = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="jobevent_job_at")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.attempt} {self.kind}"


class JobProfile(models.Model):
    """What jobs with one ``profile_key`` used when they ran (after Nimble): later runs are placed
    from this instead of their (usually inflated) request."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="profiles")
    key = models.CharField(max_length=200)
    runs = models.PositiveIntegerField(default=0)
    peak_gpu_memory_mib = models.PositiveIntegerField()
    mean_util = models.FloatField(null=True, blank=True, help_text="0..1")
    mean_runtime_s = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="profile_unique_key_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.key}"


class QuotaChange(models.Model):
    """Audit trail: who changed which quota field of a tenant, when, from what to what."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quota_changes")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    changed_at = models.DateTimeField(auto_now_add=True)
    field = models.CharField(max_length=32)
    old_value = models.CharField(max_length=64)
    new_value = models.CharField(max_length=64)

    class Meta:
        ordering = ["-changed_at"]
