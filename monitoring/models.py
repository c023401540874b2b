"""Inventory (nodes and GPUs as their agents registered them), metric rollups, job usage, alerts.

Jobs are referred to by id only (``job_id``): this app never imports ``jobs``.
"""

from django.core.validators import RegexValidator
from django.db import models

from agents.protocol import ISOLATION_MODES, MIG_PROFILE_RE
from monitoring.choices import AlertKind, NodeHealth, Resolution


class Node(models.Model):
    name = models.CharField(max_length=63, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    backend = models.CharField(max_length=32, blank=True, help_text="nvml or simulated")
    agent_version = models.CharField(max_length=32, blank=True)
    state = models.CharField(max_length=8, choices=NodeHealth.choices, default=NodeHealth.UP)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    cordoned = models.BooleanField(default=False, help_text="Cordoned nodes get no new jobs.")
    rack = models.CharField(max_length=63, blank=True, help_text="Placement prefers gangs within one rack.")
    topology = models.JSONField(default=list, blank=True, help_text="GPU-to-GPU links as the agent reported them.")
    runtimes = models.JSONField(default=list, blank=True,
                                help_text="Container runtimes the agent runs image jobs with (docker, podman, apptainer).")
    cpu_milli = models.PositiveIntegerField(null=True, blank=True,
                                            help_text="CPU offered to jobs, in thousandths of a core, as the agent registered it.")
    host_memory_mib = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="Host memory offered to jobs, in MiB, as the agent registered it.")
    registered_at = models.DateTimeField(help_text="Last time the agent (re)registered.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


# What each isolation mode means to someone reading the node page.
ISOLATION_LABELS = {
    "mps": "MPS (memory and compute limits per job)",
    "memory_limit": "Driver memory limit per job",
    "mig": "MIG instance (one job, fenced in hardware)",
    "unfenced": "Unfenced (no limits: shared only by jobs that accept it)",
}


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Index on the node (CUDA_VISIBLE_DEVICES).")
    uuid = models.CharField(max_length=128, unique=True)
    model = models.CharField(max_length=64)
    memory_mib = models.PositiveIntegerField()
    # How co-located jobs are kept apart on it, as its agent reported (agents.protocol.GpuInfo):
    # the scheduler packs an "unfenced" GPU only with jobs that accept it, and a "mig" instance
    # takes one job at a time, of its own profile. An agent that says nothing enforces nothing.
    isolation = models.CharField(max_length=16, choices=[(mode, ISOLATION_LABELS[mode]) for mode in ISOLATION_MODES],
                                 default="unfenced", help_text="mps, memory_limit, mig or unfenced.")
    mig_profile = models.CharField(max_length=32, null=True, blank=True, validators=[RegexValidator(MIG_PROFILE_RE)],
                                   help_text="MIG instances: the GPU instance profile, e.g. 1g.10gb.")
    parent_index = models.PositiveSmallIntegerField(null=True, blank=True,
                                                    help_text="MIG instances: index of the GPU it is carved from.")
    # A GPU missing from the node's latest registration is kept (allocations point at it) but
    # never offered to the scheduler.
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"], condition=models.Q(present=True), name="gpu_unique_present_index_per_node"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"


class GpuRollup(models.Model):
    """One GPU's samples folded into a fixed time bucket (sums and counts, so buckets merge)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="rollups")
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    bucket_start = models.DateTimeField()
    samples = models.PositiveIntegerField(default=0)
    util_sum = models.FloatField(default=0)
    util_n = models.PositiveIntegerField(default=0)
    util_max = models.FloatField(null=True)
    mem_sum = models.FloatField(default=0)
    mem_n = models.PositiveIntegerField(default=0)
    mem_max = models.IntegerField(null=True)
    temp_max = models.FloatField(null=True)
    power_sum = models.FloatField(default=0)
    power_n = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu", "resolution", "bucket_start"], name="gpu_rollup_unique_bucket")
        ]
        indexes = [models.Index(fields=["resolution", "bucket_start"], name="gpu_rollup_time")]

    @property
    def util_avg(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None

    @property
    def power_avg(self) -> float | None:
        return self.power_sum / self.power_n if self.power_n else None


class JobRollup(models.Model):
    """One job's GPU usage in a time bucket: memory is the max over its GPUs, util the mean."""

    job_id = models.BigIntegerField()
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    bucket_start = models.DateTimeField()
    samples = models.PositiveIntegerField(default=0)
    mem_max = models.IntegerField(null=True)
    util_sum = models.FloatField(default=0)
    util_n = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job_id", "resolution", "bucket_start"], name="job_rollup_unique_bucket")
        ]
        indexes = [models.Index(fields=["resolution", "bucket_start"], name="job_rollup_time")]

    @property
    def util_avg(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None


class JobUsage(models.Model):
    """What a job has used over its life so far, per GPU: the input to profiles and packing."""

    job_id = models.BigIntegerField(primary_key=True)
    peak_gpu_memory_mib = models.IntegerField(default=0)
    util_sum = models.FloatField(default=0)
    util_n = models.PositiveIntegerField(default=0)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    @property
    def mean_util(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None


class Alert(models.Model):
    """Something an operator should look at. Open while ``resolved_at`` is null; re-seen alerts
    refresh ``last_seen_at`` instead of piling up."""

    kind = models.CharField(max_length=24, choices=AlertKind.choices)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="alerts")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, null=True, blank=True, related_name="alerts")
    job_id = models.BigIntegerField(null=True, blank=True)
    message = models.CharField(max_length=500)
    details = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        indexes = [models.Index(fields=["kind", "resolved_at"], name="alert_kind_open")]

    def __str__(self) -> str:
        return self.message
