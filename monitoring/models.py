"""Inventory (nodes and GPUs as their agents registered them), metric rollups, job usage, alerts.

Jobs are referred to by id only (``job_id``): this app never imports ``jobs``.
"""

from dataclasses import dataclass

from django.core.validators import RegexValidator
from django.db import models

from agents.protocol import ISOLATION_MODES, JOB_FENCES, MIG_PROFILE_RE
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
    runtimes = models.JSONField(
        default=list, blank=True,
        help_text="Container runtimes the agent runs image jobs with (docker, podman, apptainer).")
    cpu_milli = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPU offered to jobs, in thousandths of a core, as the agent registered it.")
    host_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Host memory offered to jobs, in MiB, as the agent registered it.")
    # What fences every job on the node whatever its GPUs' modes, as its agent registered it
    # (agents.protocol.JOB_FENCES); None: its agent predates the report, so nobody here knows.
    job_fences = models.JSONField(null=True, blank=True,
                                  help_text="Fences of every job there (cgroup, devices, accounts) as the agent "
                                            "registered them; empty: none; null: not reported (an older agent).")
    registered_at = models.DateTimeField(help_text="Last time the agent (re)registered.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def fencing(self) -> "NodeFencing":
        """How the node pages word its job fences (:class:`NodeFencing`)."""
        return NodeFencing.of(self.job_fences)


# What a job lacks where a fence is missing, as the node pages say it.
MISSING_FENCE_WORDS = {"cgroup": "no job cgroup", "devices": "no device fence"}
FENCE_MEANINGS = {
    "cgroup": "a cgroup of its own, killed whole at its end (nothing it starts outlives it)",
    "devices": "a device filter (it opens only its own GPUs, whatever CUDA_VISIBLE_DEVICES says)",
    "accounts": "its researcher's own account (not one shared by a tenant's jobs)",
}


@dataclass(frozen=True)
class NodeFencing:
    """A node's job fences as a badge: ``state`` "fenced" (each job in a cgroup of its own with a
    device filter: what a hostile job needs fencing by), "unfenced" (one of them missing) or
    "unknown" (the agent does not say); ``text`` the badge ("fenced: cgroup, devices, accounts",
    "unfenced: no device fence"), ``detail`` what each fence there means."""

    state: str
    text: str
    detail: str

    @classmethod
    def of(cls, fences: list[str] | None) -> "NodeFencing":
        if fences is None:
            return cls("unknown", "unknown",
                       "Its agent does not report its job fences (an agent older than that report).")
        present = [fence for fence in JOB_FENCES if fence in fences]
        detail = "Every job gets " + "; ".join(FENCE_MEANINGS[fence] for fence in present) + "." if present else \
            "Jobs get no fence of their own: what a job starts can outlive it, and it can open every GPU."
        if "accounts" not in present:
            detail += " Jobs share accounts: they can signal each other and read each other's files."
        missing = [MISSING_FENCE_WORDS[fence] for fence in MISSING_FENCE_WORDS if fence not in present]
        if missing:
            return cls("unfenced", "unfenced: " + ", ".join(missing), detail)
        return cls("fenced", "fenced: " + ", ".join(present), detail)


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
