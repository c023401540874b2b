"""Tenants and their members, jobs and the GPUs allocated to them."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from agents import protocol
from jobs import state_guard
from jobs.choices import RunClass, JobEventKind, JobState, Role
from jobs.idle_policy import policy_problems


class Tenant(models.Model):
    """A team sharing the cluster, with a guaranteed share and a borrowing ceiling."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    guaranteed_gpus = models.PositiveIntegerField(default=0, help_text="GPUs the tenant is owed.")
    max_gpus = models.PositiveIntegerField(default=0, help_text="Borrowing ceiling, guaranteed included.")
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01)],
                               help_text="Share of spare capacity relative to other tenants.")
    # Idle-GPU reclaim (jobs/services/idle_reclaim.py), like Run:ai's idle-GPU timeout: minutes a
    # running job's GPUs have all been idle before each step; empty turns that step off.
    idle_notify_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Idle this long: its owner is warned. Empty: no warning.")
    idle_opportunistic_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Idle this long: a guaranteed job becomes opportunistic (keeps running, may be packed or "
                  "preempted; the tenant's guarantee frees). Empty: never.")
    idle_suspend_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Idle this long: its processes are stopped (SIGSTOP); its GPU memory stays held. "
                  "Needs a later requeue step. Empty: never.")
    idle_requeue_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Idle this long: it is stopped and put back in the queue (its GPUs freed). Empty: never.")
    idle_util_percent = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="A GPU under this utilisation is idle. Empty: COLONY_IDLE_GPU_UTIL_PERCENT.")
    # Consent to share a GPU nothing fences (no MPS, driver memory limit or MIG: isolation
    # "unfenced"): there a neighbour that allocates past its share can make this tenant's job fail
    # with CUDA out-of-memory. On by default, today's behaviour, with the scheduler's
    # memory-pressure preemption as the only guard; off, its jobs never join or receive neighbours
    # on such a GPU (a job's own accepts_unfenced overrides this).
    unfenced_sharing = models.BooleanField(
        default=True,
        help_text="Its jobs may share GPUs that enforce no memory or compute limits (isolation 'unfenced'), "
                  "guarded only by memory-pressure preemption. A job's own setting overrides it.")
    # GPU-seconds of recent use, decayed with a half-life: the fair-share order of borrowers.
    decayed_usage = models.FloatField(default=0.0)
    usage_updated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(max_gpus__gte=F("guaranteed_gpus")),
                                   name="tenant_max_at_least_guaranteed"),
            models.CheckConstraint(condition=Q(weight__gt=0), name="tenant_weight_positive"),
        ]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        problems = policy_problems(self)
        if problems:
            raise ValidationError(problems)


class MembershipQuerySet(models.QuerySet):
    def visible_to(self, user) -> "MembershipQuerySet":
        """Operators see every membership, a tenant lead their tenants' members, anyone else their own."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self
        led = Membership.objects.filter(user=user, role=Role.LEAD).values("tenant_id")
        return self.filter(models.Q(user=user) | models.Q(tenant_id__in=led))


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.RESEARCHER)
    # Set by a lead of the tenant (or an operator): what this member may hold at once here.
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most GPUs this member's jobs hold at once in the tenant; empty: no limit.")
    max_running_jobs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most jobs of this member running at once; empty: no limit.")

    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}"


class CodeArchive(models.Model):
    """A gzipped tar of a researcher's code directory (``colony submit`` packs the current one),
    stored once per tenant and content (sha256). A job that names it starts in an unpacked copy."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="code_archives")
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField(help_text="Bytes of the compressed archive.")
    files = models.PositiveIntegerField(default=0, help_text="Regular files in it.")
    unpacked_size = models.BigIntegerField(default=0, help_text="Bytes once unpacked.")
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)
    # Its bytes were dropped (no job needed them for COLONY_CODE_RETENTION_DAYS); uploading the
    # same content again brings them back.
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "sha256"], name="code_unique_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.sha256[:12]}"


class JobArray(models.Model):
    """``array: "0-99%8"``: one submission, one job per index, at most ``max_running`` at once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="arrays")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="arrays")
    name = models.CharField(max_length=200)
    spec = models.CharField(max_length=200, help_text='As submitted, e.g. "0-99%8".')
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit.")
    submitted_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"array {self.pk} {self.name}"


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


class Job(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.JSONField(help_text="argv list; run without a shell.")
    env = models.JSONField(default=dict, blank=True, help_text="Extra environment variables for the job.")
    gpus = models.PositiveSmallIntegerField()
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True, help_text="Memory needed per GPU.")
    # Of the node(s), for the whole job; a gang spread over nodes takes them in proportion to its GPUs.
    cpu_milli = models.PositiveIntegerField(default=0,
                                            help_text="CPU needed, in thousandths of a core (0: none asked).")
    host_memory_mib = models.PositiveIntegerField(default=0, help_text="Host memory needed, in MiB (0: none asked).")
    gpu_milli = models.PositiveSmallIntegerField(
        default=1000, validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of one GPU in thousandths (below 1000 only with 1 GPU); fractional jobs share GPUs.",
    )
    gpu_models = models.JSONField(default=list, blank=True, help_text="Allowed GPU models; empty means any.")
    # Runs only on a MIG instance of exactly this profile, alone there (one GPU, whole).
    mig_profile = models.CharField(max_length=32, null=True, blank=True,
                                   validators=[RegexValidator(protocol.MIG_PROFILE_RE,
                                                              "Not a MIG profile, e.g. 1g.10gb.")],
                                   help_text="MIG instance profile to run on, e.g. 1g.10gb; "
                                             "empty: a whole GPU or a share.")
    # May share a GPU that fences nothing ("unfenced") with other jobs; None: its tenant's setting.
    accepts_unfenced = models.BooleanField(
        null=True, blank=True,
        help_text="May share GPUs that enforce no limits (isolation 'unfenced'); empty: the tenant's setting.")
    priority = models.SmallIntegerField(default=0)
    opportunistic_only = models.BooleanField(default=False, help_text="Never run as guaranteed (cheap, preemptible).")
    shareable = models.BooleanField(default=False, help_text="A guaranteed job that accepts GPU neighbours.")
    max_nodes = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Gang spread limit; empty = any.")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True, help_text="Stopped when exceeded.")
    profile_key = models.CharField(max_length=200, blank=True,
                                   help_text="Jobs with the same key are placed from the recorded profile.")
    # Where and in what it runs. ``workdir`` is a directory on the node (a shared filesystem);
    # ``code`` an uploaded archive the job starts in an unpacked copy of; neither: an empty folder.
    workdir = models.CharField(max_length=1024, blank=True, help_text="Directory on the node to start in.")
    code = models.ForeignKey(CodeArchive, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs")
    image = models.CharField(max_length=255, blank=True, help_text="Container image, run by the node's runtime.")
    venv = models.CharField(max_length=1024, blank=True, help_text="Python virtualenv on the node to activate.")
    conda = models.CharField(max_length=1024, blank=True, help_text="Conda environment prefix on the node.")
    # Preemption notice: the job gets its stop signal and this long before SIGKILL.
    preempt_grace_s = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="Seconds between the preemption notice and SIGKILL.")
    stop_signal = models.CharField(max_length=8, default="SIGTERM",
                                   choices=[(name, name)
                                            for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")],
                                   help_text="Sent first when it is stopped or preempted; SIGKILL after the grace.")
    checkpoints = models.BooleanField(default=False,
                                      help_text="Saves its state when told to stop: preferred as a preemption victim.")
    lost_work_s = models.FloatField(default=0.0, help_text="Run time thrown away by preemptions, in seconds.")
    array = models.ForeignKey(JobArray, on_delete=models.CASCADE, null=True, blank=True, related_name="tasks")
    array_index = models.PositiveIntegerField(null=True, blank=True)

    run_class = models.CharField(max_length=16, choices=RunClass.choices, blank=True,
                                 help_text="How it was admitted when placed.")
    reserved_since = models.DateTimeField(null=True, blank=True, help_text="When its gang reservation began.")
    preempt_count = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveIntegerField(
        default=0, help_text="Placements so far; the current one's launch command is launch-<id>-<attempt>.")
    eta_error_s = models.FloatField(null=True, blank=True,
                                    help_text="First placement minus the first predicted start; + is late.")

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
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

    @property
    def pending_reason(self) -> dict | None:
        """Why it waits, as the API shows it ({code, message, details[, eta_at]}), while it is
        pending or being preempted back to the queue; None otherwise. Kept in ``JobWait``."""
        if self.state not in (JobState.PENDING, JobState.PREEMPTING):
            return None
        try:
            wait = self.wait
        except JobWait.DoesNotExist:
            return None
        return wait.as_reason()

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["tenant", "state"], name="job_tenant_state"),
            # Every submission counts its owner's waiting jobs (COLONY_MAX_PENDING_PER_USER).
            models.Index(fields=["owner"], condition=Q(state="PENDING"), name="job_pending_by_owner"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_positive"),
            models.CheckConstraint(condition=Q(gpu_milli=1000) | Q(gpus=1), name="job_fraction_only_single_gpu"),
            models.CheckConstraint(condition=Q(mig_profile__isnull=True) | Q(gpus=1, gpu_milli=1000),
                                   name="job_mig_one_whole_instance"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def save(self, *args, **kwargs):
        state_guard.saving(self, kwargs)  # the lifecycle alone changes a job's state
        super().save(*args, **kwargs)


class JobPromise(models.Model):
    """The GPUs a reclaim freed for a pending job (the core's ``Promise``), kept while it waits for
    them: the next cycles place it there, and nobody else, before anything else is placed. A
    handful of rows, in a table of their own: each cycle reads them all, and a partial index on the
    jobs table was only used once PostgreSQL had statistics for the new column (until the next
    autovacuum analysis, each read scanned every job ever submitted). The loop deletes a promise
    once the core no longer holds it (placed, cancelled, lapsed); Django deletes it with its job."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="promise")
    gpu_ids = models.JSONField(help_text="Ids of the GPUs freed for it.")

    def __str__(self) -> str:
        return f"job {self.job_id}: GPUs {self.gpu_ids}"


class JobWait(models.Model):
    """Why a waiting job waits and when it may start: the scheduling loop's verdict, rewritten
    whenever it changes. A narrow table of its own, because on a busy cluster most of 50,000
    verdicts change in a cycle and rewriting the wide job row for each cost five times as much.
    The row goes when the job is placed or ends. On PostgreSQL its pages are kept half empty
    (fillfactor 50, migration 0018) so that a rewritten verdict stays on its page and the index is
    not touched: rewriting 47,000 verdicts took 0.18 s instead of 0.66 s.

    No foreign-key constraint in the database: checking one locks each job row it names at commit,
    which cost a first cycle (47,000 new verdicts) more than writing them. The loop writes verdicts
    only for jobs it finds pending in the same statement, and Django still deletes a job's verdict
    with the job.

    PostgreSQL also keeps a digest of each reason in a column Django does not know (migration
    0022, read by the scheduling loop): a change to ``reason``'s type must drop it first."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="wait",
                               db_constraint=False)
    reason = models.JSONField(help_text="{code, message, details}.")
    eta_at = models.BigIntegerField(null=True, blank=True, help_text="Unix time it may start, when known.")
    first_eta_at = models.BigIntegerField(
        null=True, blank=True,
        help_text="The first start time predicted in this wait (eta_accuracy reads the first attempt's).")

    def as_reason(self) -> dict:
        return self.reason if self.eta_at is None else {**self.reason, "eta_at": self.eta_at}

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.reason.get('code', '?')}"


class JobDependency(models.Model):
    """``job`` waits for ``on`` to end: ``ok`` (after_ok) only runs if it succeeded and is
    cancelled otherwise; ``any`` (after_any) runs however it ended."""

    class Kind(models.TextChoices):
        OK = "ok", "after it succeeds"
        ANY = "any", "after it ends"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    on = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependants")
    kind = models.CharField(max_length=3, choices=Kind.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "on"], name="dependency_unique_pair")]

    def __str__(self) -> str:
        return f"{self.job_id} after_{self.kind} {self.on_id}"


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
    # Runs that brought a utilisation reading (not every run does: MPS clients sharing a GPU, MIG
    # instances): the mean is over these, so runs without one do not shrink a new reading's weight.
    util_runs = models.PositiveIntegerField(default=0)
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


class NotificationSettings(models.Model):
    """A user's opt-in: which of their jobs' events reach them, by email and/or webhook."""

    EVENTS = ("succeeded", "failed", "preempted", "long_wait")

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="notification_settings")
    email = models.BooleanField(default=False, help_text="Mail the user's address.")
    webhook_url = models.URLField(max_length=500, blank=True, help_text="Slack-compatible incoming webhook.")
    events = models.JSONField(default=list, blank=True, help_text="Any of succeeded, failed, preempted, long_wait.")
    long_wait_minutes = models.PositiveIntegerField(default=60, validators=[MinValueValidator(1)])

    def __str__(self) -> str:
        return f"notifications of {self.user}"


class Notification(models.Model):
    """One message to send (or sent): retried by a Celery task, never by the scheduler."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Gave up"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=16)
    channel = models.CharField(max_length=8)  # email | webhook
    # One message per job, event, attempt and channel, however often the trigger fires.
    dedupe_key = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "created_at"], name="notification_state_created")]


class SchedulerLease(models.Model):
    """Who may write scheduling decisions, and since which epoch (jobs/services/leadership.py)."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=200, blank=True)
    # Grows by one each time the lease changes hands: a decision carries the epoch it was made
    # under, and a transaction whose epoch is no longer the row's commits nothing.
    epoch = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField()  # when the holder took it (the epoch began)
    released = models.BooleanField(default=True)  # handed back at a cycle's end, not merely expired
