"""REST representations of jobs; submission validation lives here and in the submit form.

A bulk submission validates each of its jobs with :class:`JobSubmitSerializer`, handing it (in the
context) the submitter's tenants and the inventory read once for all of them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents import protocol, tunnel_protocol
from cluster_ui.api.shared_fields import CheckedOnSharedFields, RepresentedOnce
from jobs.choices import TERMINAL_STATES, RunClass, JobEventKind, JobState
from jobs.models import CodeArchive, Job
from jobs.scheduling.reasons import ReasonCode
from jobs.services import arrays, cancellation, idle_reclaim, roles, sessions
from jobs.services.eta import eta_seconds
from jobs.services.submission import tenants_of
from monitoring.services.registry import cluster_inventory

MAX_ARGV = 256
MAX_ARG_LENGTH = 4096
MAX_ENV = 64
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The most a job's command and env may take in its launch, encoded: a launch is one message of at
# most protocol.MAX_MESSAGE_BYTES, and the control plane's fields (ids, GPUs, rendezvous variables,
# the MAC) need the rest. A bigger job would be refused by its node on every re-send, forever PLACED.
MAX_LAUNCH_PAYLOAD_BYTES = protocol.MAX_MESSAGE_BYTES - 16 * 1024
# Set by the agent for every job; a job spec may not override them.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "COLONY_JOB_ID", "COLONY_REDIS_URL", "REDIS_URL",
                "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
MAX_DEPENDENCIES = 64
_IMAGE_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}|/[A-Za-z0-9._/+-]{1,254})$")


class RejectUnknownFieldsMixin:
    """A misspelt field (``gpu`` for ``gpus``) must fail loudly, not be silently dropped."""

    def known_field_names(self):
        return self.fields.keys()

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(data.keys() - self.known_field_names())
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class AllocationSerializer(serializers.Serializer):
    node = serializers.CharField(source="gpu.node.name")
    gpu_index = serializers.IntegerField(source="gpu.index")
    gpu_model = serializers.CharField(source="gpu.model")
    gpu_milli = serializers.IntegerField()
    memory_limit_mib = serializers.IntegerField(allow_null=True)
    duty_cycle = serializers.FloatField()
    rank = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="The placement (attempt) it was made for.")
    created_at = serializers.DateTimeField()
    released_at = serializers.DateTimeField(allow_null=True)


class JobEventSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(help_text="0 before the first placement.")
    kind = serializers.ChoiceField(JobEventKind.choices)
    at = serializers.DateTimeField()
    node = serializers.CharField(allow_blank=True)
    message = serializers.CharField(allow_blank=True)


class PendingReasonSerializer(serializers.Serializer):
    """``jobs.scheduling.reasons.PendingReason`` as stored on the job: the one vocabulary the
    API, the pages and the CLI show."""

    code = serializers.ChoiceField([(code.value, code.value) for code in ReasonCode],
                                   help_text="What a program matches on; see the message for people.")
    message = serializers.CharField()
    details = serializers.DictField(help_text="The numbers behind the message; keys depend on the code.")
    eta_at = serializers.DateTimeField(allow_null=True, help_text="When it may start, the scheduler's estimate; "
                                                                  "null when it cannot tell.")

    def to_representation(self, reason):
        # Stored as Unix seconds (JobWait.eta_at, cheap for the loop to compare); shown as the
        # API shows every other time.
        eta_at = reason.get("eta_at")
        if isinstance(eta_at, (int, float)) and not isinstance(eta_at, bool):
            reason = {**reason, "eta_at": datetime.fromtimestamp(eta_at, timezone.utc)}
        return super().to_representation(reason)


class JobSerializer(RepresentedOnce, serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    pending_reason = PendingReasonSerializer(read_only=True, allow_null=True)
    allocations = AllocationSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True,
                                help_text="The job's timeline, oldest first: each attempt placed, started, "
                                          "stopped and why, back in the queue, finished.")
    # Declared so the schema says what the model allows: blank until the job is placed.
    run_class = serializers.ChoiceField(RunClass.choices, allow_blank=True, read_only=True,
                                        help_text="How it was admitted when placed; empty until then.")
    eta_s = serializers.SerializerMethodField(help_text="Pending: seconds until it is likely to start, when the "
                                                        "scheduler can tell.")
    code = serializers.CharField(source="code.sha256", read_only=True, allow_null=True, default=None,
                                 help_text="sha256 of the code archive it starts in, if any.")
    array_id = serializers.IntegerField(read_only=True, allow_null=True)
    dependencies = serializers.SerializerMethodField(help_text='Jobs it waits for: [{"job": 41, "kind": "ok"}].')
    preemptions = serializers.IntegerField(source="preempt_count", read_only=True)
    cpus = serializers.SerializerMethodField(help_text="CPU cores it asked for (whole job).")
    session = serializers.SerializerMethodField(
        help_text='An interactive session: a terminal, {"idle_timeout_s": N} (attach with colony shell --attach ID), '
                  'or a notebook, {"idle_timeout_s": N, "kind": "notebook", "open": path} (a browser opens it at '
                  "path, on the dashboard); null for a batch job.")
    idle = serializers.SerializerMethodField(
        help_text="Running with all its GPUs idle under its tenant's idle policy: {since, minutes, done, next_step, "
                  "next_at, upcoming: [{step, minutes, at}]}; null otherwise.")

    class Meta:
        model = Job
        fields = [
            "id", "name", "tenant", "owner", "command", "env", "eta_s",
            "gpus", "gpu_milli", "gpu_memory_mib", "gpu_models",
            "cpus", "host_memory_mib", "priority", "opportunistic_only", "shareable", "max_nodes", "max_runtime_s",
            "profile_key", "mig_profile", "accepts_unfenced",
            "workdir", "code", "image", "venv", "conda", "preempt_grace_s", "stop_signal", "checkpoints",
            "array_id", "array_index", "dependencies", "preemptions", "lost_work_s",
            "state", "run_class", "pending_reason", "allocations", "events", "attempt", "requeue_count",
            "preempt_count",
            "peak_gpu_memory_mib", "exit_code", "error", "output_tail", "submitted_at", "placed_at",
            "started_at", "finished_at", "idle", "session",
        ]
        read_only_fields = fields

    @extend_schema_field(float)
    def get_cpus(self, job: Job) -> float:
        return job.cpu_milli / 1000

    def get_eta_s(self, job) -> float | None:
        return eta_seconds(job)

    @extend_schema_field({"type": "object", "nullable": True})
    def get_idle(self, job) -> dict | None:
        idle = idle_reclaim.idle_state(job)
        return None if idle is None else idle.as_dict()

    @extend_schema_field({"type": "object", "nullable": True})
    def get_session(self, job) -> dict | None:
        idle = sessions.idle_timeout_s(job)
        if idle is not None:
            return {"idle_timeout_s": idle}  # a terminal: as it was before notebooks came
        idle = tunnel_protocol.notebook_idle_s(job.env or {})
        return None if idle is None else {"idle_timeout_s": idle, "kind": "notebook",
                                          "open": reverse("jobs:notebook", args=[job.pk])}

    def get_dependencies(self, job) -> list[dict]:
        return [{"job": d.on_id, "kind": d.kind} for d in job.dependencies.all()]


class JobSubmitSerializer(CheckedOnSharedFields, RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False,
                                 help_text="Defaults to the program name in `command`.")
    command = serializers.ListField(
        child=StrictCharField(max_length=MAX_ARG_LENGTH, allow_blank=True, trim_whitespace=False),
        min_length=1, max_length=MAX_ARGV,
        help_text='argv list, run without a shell, e.g. ["python", "train.py", "--epochs", "3"].',
        # DRF's own words here are "Ensure this field has at least 1 elements."
        error_messages={"min_length": 'Give the program to run, e.g. ["python", "train.py"].',
                        "max_length": f"At most {MAX_ARGV} arguments."},
    )
    env = serializers.DictField(child=StrictCharField(max_length=4096, allow_blank=True), required=False,
                                help_text='Extra environment variables, e.g. {"EPOCHS": "3"}.')
    gpus = serializers.IntegerField(min_value=1, help_text="Number of GPUs, all granted at once (a gang).")
    gpu_milli = serializers.IntegerField(
        min_value=1, max_value=1000, required=False, default=1000,
        help_text="Share of one GPU in thousandths, e.g. 250 for a quarter; below 1000 only with gpus=1.",
    )
    gpu_memory_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True,
                                              help_text="GPU memory needed on each GPU, in MiB.")
    cpus = serializers.DecimalField(
        max_digits=7, decimal_places=3, min_value=0, max_value=protocol.CPU_MILLI_MAX // 1000, required=False,
        help_text="CPU cores for the whole job, e.g. 8 or 0.5 (a gang spread over nodes takes them in proportion "
                  "to its GPUs on each). Default: the cluster's per-GPU default.")
    host_memory_mib = serializers.IntegerField(
        min_value=0, max_value=protocol.HOST_MEMORY_MIB_MAX, required=False,
        help_text="Host memory (RAM) for the whole job, in MiB. Default: the cluster's per-GPU default.")
    gpu_models = serializers.ListField(child=StrictCharField(max_length=64), required=False, max_length=16,
                                       help_text='Allowed GPU models, e.g. ["V100-32GB"]; empty means any.')
    mig_profile = StrictCharField(
        max_length=32, required=False, allow_null=True, allow_blank=True,
        help_text="Run on a MIG instance of this profile, e.g. 1g.10gb (gpus=1, whole): it has the instance to "
                  "itself, fenced in hardware. Empty: a whole GPU or a share of one.")
    accepts_unfenced = serializers.BooleanField(
        required=False, allow_null=True, default=None,
        help_text="May share a GPU that enforces no memory or compute limits (isolation 'unfenced'), where a "
                  "neighbour's allocation can make it run out of memory. Null: the tenant's setting "
                  "(unfenced_sharing).")
    priority = serializers.IntegerField(min_value=-10, max_value=10, required=False, default=0,
                                        help_text="Order within your tenant; higher runs first.")
    opportunistic_only = serializers.BooleanField(required=False, default=False,
                                                  help_text="Run only on spare capacity; may be preempted.")
    shareable = serializers.BooleanField(required=False, default=False,
                                         help_text="Allow other jobs on the same GPUs.")
    max_nodes = serializers.IntegerField(min_value=1, required=False, allow_null=True,
                                         help_text="Spread the gang over at most this many nodes.")
    max_runtime_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, required=False, allow_null=True,
                                             help_text="Stop the job after this many seconds.")
    profile_key = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                        help_text="Jobs sharing a key are placed from the recorded profile.")
    tenant = serializers.SlugField(required=False,
                                   help_text="Tenant to charge; optional when you belong to exactly one.")
    workdir = StrictCharField(max_length=1024, required=False, allow_blank=True,
                              help_text="Absolute directory on the node to start in (a shared filesystem).")
    code = StrictCharField(max_length=64, required=False, allow_blank=True,
                           help_text="sha256 of an archive uploaded to /api/v1/code/: the job starts in a copy of it.")
    image = StrictCharField(max_length=255, required=False, allow_blank=True,
                            help_text="Container image to run the command in (nodes with a container runtime).")
    venv = StrictCharField(max_length=1024, required=False, allow_blank=True,
                           help_text="Python virtualenv on the node to activate, by path.")
    conda = StrictCharField(max_length=1024, required=False, allow_blank=True,
                            help_text="Conda environment on the node to activate, by prefix path.")
    preempt_grace_s = serializers.IntegerField(
        min_value=0, max_value=protocol.MAX_PREEMPT_GRACE_S, required=False, allow_null=True,
        help_text="Seconds between the preemption notice (stop_signal, COLONY_PREEMPT_FILE) and SIGKILL.")
    stop_signal = serializers.ChoiceField(["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"], required=False,
                                          default="SIGTERM", help_text="Sent first when it is stopped or preempted.")
    checkpoints = serializers.BooleanField(required=False, default=False,
                                           help_text="It saves its state when told to stop: preempted first, "
                                                     "as it loses nothing.")
    array = StrictCharField(max_length=200, required=False, allow_blank=True,
                            help_text='Submit one job per index: "0-99", "1,3,5-7", "0-99%8" (at most 8 at once). '
                                      "Each gets COLONY_ARRAY_INDEX.")
    after_ok = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False,
                                     max_length=MAX_DEPENDENCIES,
                                     help_text="Start only after these jobs succeed; cancelled if one does not.")
    after_any = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False,
                                      max_length=MAX_DEPENDENCIES, help_text="Start only after these jobs end.")
    interactive = serializers.BooleanField(
        required=False, default=False,
        help_text="An interactive session (colony shell): the command runs on a terminal you attach to through "
                  "/api/v1/jobs/{id}/session/, on one node.")
    idle_timeout_s = serializers.IntegerField(
        min_value=protocol.SESSION_IDLE_MIN_S, max_value=protocol.SESSION_IDLE_MAX_S, required=False, allow_null=True,
        help_text=f"An interactive session ends after this long without input (default {sessions.DEFAULT_IDLE_S}).")
    notebook = serializers.BooleanField(
        required=False, default=False,
        help_text="A notebook session (colony jupyter): the command (e.g. jupyter lab, from the job's own environment) "
                  "is a Jupyter server, opened from the job page through the control plane; idle_timeout_s applies.")

    def validate_command(self, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise serializers.ValidationError("The program (first element) must not be blank.")
        return command

    def validate_env(self, env: dict[str, str]) -> dict[str, str]:
        if len(env) > MAX_ENV:
            raise serializers.ValidationError(f"At most {MAX_ENV} variables.")
        bad = sorted(name for name in env if not ENV_NAME_RE.match(name))
        if bad:
            raise serializers.ValidationError(f"Invalid variable name(s): {', '.join(bad)}.")
        reserved = sorted(name for name in env if name in RESERVED_ENV or name.startswith("COLONY_")
                          and name != "COLONY_SIM_WORKLOAD")
        if reserved:
            raise serializers.ValidationError(f"Set by Colony, cannot be overridden: {', '.join(reserved)}.")
        identity = protocol.identity_env_names(env, settings.COLONY_JOB_ENV_ALLOWED)
        if identity:
            raise serializers.ValidationError(
                f"Cannot be set: {', '.join(identity)} would change who the job is or what runs inside it "
                "(HOME, USER and LOGNAME come from the account the job runs as).")
        return env

    def _known_tenants(self):
        """The submitter's tenants when the caller looked them up already (a bulk submission), else None."""
        return self.context.get("tenants")

    def validate_tenant(self, slug: str):
        known = self._known_tenants()
        if known is not None:
            tenant = next((t for t in known if t.slug == slug), None)
        else:
            tenant = tenants_of(self.context["request"].user).filter(slug=slug).first()
        if tenant is None:
            # Same answer whether the tenant does not exist or is someone else's.
            raise serializers.ValidationError(f"Unknown tenant '{slug}', or you are not a member of it.")
        return tenant

    def validate(self, attrs):
        if "tenant" not in attrs:
            known = self._known_tenants()
            mine = list(known[:2]) if known is not None else list(tenants_of(self.context["request"].user)[:2])
            if not mine:
                raise serializers.ValidationError({"tenant": ["You are not a member of any tenant."]})
            if len(mine) > 1:
                raise serializers.ValidationError({"tenant": ["You belong to several tenants; say which one."]})
            attrs["tenant"] = mine[0]
        if attrs.get("gpu_milli", 1000) < 1000 and attrs["gpus"] != 1:
            raise serializers.ValidationError({"gpu_milli": ["A GPU fraction is only possible with gpus=1."]})
        self._check_mig_request(attrs)
        self._check_session(attrs)
        self._check_launch_size(attrs["command"], attrs.get("env") or {})
        self._host_request(attrs)
        self._check_where_and_what(attrs)
        inventory = self.context["inventory"] if "inventory" in self.context else cluster_inventory()
        if inventory.registered:  # before any node registers, nothing is refused on size: the job waits
            if attrs.get("mig_profile"):
                self._check_mig_inventory(attrs, inventory)
            elif not inventory.total_gpus:
                raise serializers.ValidationError({"mig_profile": [
                    "Every GPU of this cluster is split into MIG instances, which run only jobs that ask for one: "
                    f"give mig_profile (one of {', '.join(name for name, _ in inventory.mig_profiles)})."]})
            else:
                self._check_inventory(attrs, inventory)
            self._check_host(attrs, inventory)
            self._check_ceiling(attrs)
            if attrs.get("image") and not inventory.runtimes:
                raise serializers.ValidationError({"image": [
                    "No node of this cluster runs containers (no agent was started with --container-runtime); "
                    "use venv or conda, or ask an operator."]})
        self._check_member_cap(attrs)
        self._check_dependencies(attrs)
        spec = attrs.pop("array", "").strip()
        if spec:
            try:
                attrs["array"] = arrays.parse(spec, settings.COLONY_MAX_ARRAY_SIZE)
            except ValueError as exc:
                raise serializers.ValidationError({"array": [str(exc)]}) from None
            attrs["array_text"] = spec
        attrs.setdefault("name", attrs["command"][0].rsplit("/", 1)[-1][:200])
        return attrs

    def _code_archive(self, tenant, sha: str):
        # A bulk submission of many jobs in one code archive looks it up once.
        found = self.context.setdefault("code_archives", {})
        key = (tenant.pk, sha)
        if key not in found:
            found[key] = (CodeArchive.objects.filter(tenant=tenant, sha256=sha, purged_at__isnull=True)
                          .only("pk", "sha256").first())
        return found[key]

    def _check_where_and_what(self, attrs) -> None:
        """Where it starts and in what environment: at most one of each pair, node paths absolute."""
        for name in ("workdir", "venv", "conda"):
            path = attrs.get(name, "")
            if path and (not path.startswith("/") or "\x00" in path or "\n" in path):
                raise serializers.ValidationError({name: [f"Give an absolute path on the node, e.g. /shared/{name}."]})
        if attrs.get("workdir") and attrs.get("code"):
            raise serializers.ValidationError({"code": ["Give workdir or code, not both."]})
        if attrs.get("venv") and attrs.get("conda"):
            raise serializers.ValidationError({"conda": ["Give venv or conda, not both."]})
        if attrs.get("image") and not _IMAGE_RE.match(attrs["image"]):
            raise serializers.ValidationError({"image": ["Not an image name, e.g. pytorch/pytorch:2.4.0-cuda12.1."]})
        grace = attrs.get("preempt_grace_s")
        if grace is not None and grace > settings.COLONY_MAX_PREEMPT_GRACE_S:
            raise serializers.ValidationError({"preempt_grace_s": [
                f"At most {settings.COLONY_MAX_PREEMPT_GRACE_S} s on this cluster (COLONY_MAX_PREEMPT_GRACE_S)."]})
        sha = attrs.pop("code", "")
        if sha:
            archive = self._code_archive(attrs["tenant"], sha.lower())
            if archive is None:
                raise serializers.ValidationError({"code": [
                    f"No code archive {sha[:12]} in tenant {attrs['tenant'].slug}; upload it first "
                    "(POST /api/v1/code/, which colony submit does)."]})
            attrs["code"] = archive

    def _check_dependencies(self, attrs) -> None:
        """Dependencies are jobs of the same tenant the submitter can see: a job in another tenant
        would tell, by when this one starts, how that one is doing."""
        ok, any_ = list(dict.fromkeys(attrs.get("after_ok") or [])), list(dict.fromkeys(attrs.get("after_any") or []))
        wanted = ok + any_
        if not wanted:
            return
        if len(wanted) > MAX_DEPENDENCIES:
            raise serializers.ValidationError({"after_ok": [f"At most {MAX_DEPENDENCIES} dependencies."]})
        if set(ok) & set(any_):
            raise serializers.ValidationError({"after_any": ["A job is in both after_ok and after_any."]})
        found = dict(Job.objects.visible_to(self.context["request"].user).filter(pk__in=wanted, tenant=attrs["tenant"])
                     .values_list("pk", "state"))
        for field, ids in (("after_ok", ok), ("after_any", any_)):
            missing = [i for i in ids if i not in found]
            if missing:
                raise serializers.ValidationError({field: [
                    f"No job {missing[0]} in tenant {attrs['tenant'].slug}, or not one you can see."]})
        doomed = [i for i in ok if found[i] in TERMINAL_STATES and found[i] != JobState.SUCCEEDED]
        if doomed:
            raise serializers.ValidationError({"after_ok": [
                f"Job {doomed[0]} ended {found[doomed[0]].lower()}; a job after it succeeds could never start."]})
        attrs["after_ok"], attrs["after_any"] = ok, any_

    @staticmethod
    def _host_request(attrs) -> None:
        """``cpus`` becomes ``cpu_milli``; what is not given, the cluster's per-GPU default."""
        gpus = attrs["gpus"] * attrs.get("gpu_milli", 1000) / 1000
        cpus = attrs.pop("cpus", None)
        attrs["cpu_milli"] = (round(cpus * 1000) if cpus is not None
                              else round(settings.COLONY_DEFAULT_CPUS_PER_GPU * 1000 * gpus))
        attrs.setdefault("host_memory_mib", round(settings.COLONY_DEFAULT_HOST_MEMORY_MIB_PER_GPU * gpus))

    @staticmethod
    def _check_host(attrs, inventory) -> None:
        """Refuse CPU or host memory no node (a single-node job) or no cluster (a spread gang) offers."""
        one_node = attrs["gpus"] == 1 or attrs.get("max_nodes") == 1
        for field, need, largest, total, unit in (
                ("cpus", attrs["cpu_milli"], inventory.largest_cpu_milli, inventory.total_cpu_milli, "CPU cores"),
                ("host_memory_mib", attrs["host_memory_mib"], inventory.largest_host_memory_mib,
                 inventory.total_host_memory_mib, "MiB of host memory")):
            scale = 1000 if field == "cpus" else 1
            if one_node and largest is not None and need > largest:
                raise serializers.ValidationError({field: [
                    f"No node offers {need / scale:g} {unit}; the largest offers {largest / scale:g}."]})
            if not one_node and total is not None and need > total:
                raise serializers.ValidationError({field: [
                    f"The whole cluster offers {total / scale:g} {unit}; {need / scale:g} can never be granted."]})

    @staticmethod
    def _check_mig_request(attrs) -> None:
        """A MIG instance is one device taken whole: one instance per job, no fraction of it."""
        profile = attrs.pop("mig_profile", None) or None
        if profile is None:
            return
        if not re.match(protocol.MIG_PROFILE_RE, profile):
            raise serializers.ValidationError({"mig_profile": [
                f"'{profile}' is not a MIG profile; give one such as 1g.10gb or 3g.40gb."]})
        if attrs["gpus"] != 1:
            raise serializers.ValidationError({"mig_profile": [
                f"A job with a MIG profile runs on one MIG instance: ask for gpus=1, not {attrs['gpus']}."]})
        if attrs.get("gpu_milli", 1000) < 1000:
            raise serializers.ValidationError({"gpu_milli": [
                "A MIG instance is not shared: leave gpu_milli at 1000 with mig_profile (a smaller profile is "
                "the smaller share)."]})
        attrs["mig_profile"] = profile

    @staticmethod
    def _check_mig_inventory(attrs, inventory) -> None:
        """Refuse a MIG profile no online node has, or more memory than its instances hold."""
        profile, memory = attrs["mig_profile"], attrs.get("gpu_memory_mib")
        largest = inventory.largest_mig_mib(profile)
        if largest is None:
            offered = ", ".join(name for name, _ in inventory.mig_profiles) or "none (no GPU is in MIG mode)"
            raise serializers.ValidationError({"mig_profile": [
                f"No node has a MIG instance of profile {profile}; the cluster's MIG profiles: {offered}."]})
        if memory and memory > largest:
            raise serializers.ValidationError({"gpu_memory_mib": [
                f"No MIG instance of profile {profile} has {memory} MiB; the largest has {largest} MiB."]})

    @staticmethod
    def _check_inventory(attrs, inventory) -> None:
        """Refuse what no GPU present on an online node could ever run."""
        gpus, memory = attrs["gpus"], attrs.get("gpu_memory_mib")
        wanted = set(attrs.get("gpu_models") or [])
        unknown_models = sorted(wanted - inventory.models)
        if unknown_models:
            raise serializers.ValidationError({"gpu_models": [
                f"Unknown GPU model(s) {', '.join(unknown_models)}; "
                f"the cluster has {', '.join(sorted(inventory.models))}."
            ]})
        which = f" {' or '.join(sorted(wanted))}" if wanted else ""
        largest = inventory.largest_mib_of(wanted)
        if memory and memory > largest:
            raise serializers.ValidationError(
                {"gpu_memory_mib": [f"No{which} GPU has {memory} MiB; the largest has {largest} MiB."]}
            )
        per_node = inventory.fitting_per_node(wanted, memory)
        by_model = inventory.fitting_per_node_by_model(wanted, memory)
        one_model = ""
        if gpus > 1 and len([w for w in by_model.values() if sum(w)]) > 1:
            # A gang runs on GPUs of one model: what counts is the model that has the most.
            per_node = max(by_model.values(), key=lambda widths: (sum(widths), widths))
            one_model = " of one model (a gang runs on one GPU model)"
        total = sum(per_node)
        if gpus > total:
            restricted = total < inventory.total_gpus
            fit = f" that fit the request ({which.strip() or 'any model'}" + (f", {memory} MiB" if memory else "") + ")"
            raise serializers.ValidationError({"gpus": [
                f"The cluster has {total} GPUs{fit if restricted and not one_model else ''}{one_model}; "
                f"{gpus} can never be granted."
            ]})
        max_nodes = attrs.get("max_nodes")
        if max_nodes:
            widest = (max(sum(w[:max_nodes]) for w in by_model.values()) if one_model
                      else sum(per_node[:max_nodes]))
            if gpus > widest:
                raise serializers.ValidationError({"gpus": [
                    f"No {max_nodes} node(s) together have {gpus} GPUs"
                    f"{' that fit the request' if total < inventory.total_gpus else ''}; "
                    f"the most is {widest}."
                ]})

    def _check_member_cap(self, attrs) -> None:
        """A job bigger than a lead lets its submitter hold in the tenant would wait for ever."""
        caps = self.context.setdefault("member_caps", {})  # a bulk submission asks once per tenant
        tenant = attrs["tenant"]
        if tenant.pk not in caps:
            caps[tenant.pk] = roles.member_gpu_cap(self.context["request"].user, tenant)
        cap, need_milli = caps[tenant.pk], attrs["gpus"] * attrs.get("gpu_milli", 1000)
        if cap is not None and need_milli > cap * 1000:
            raise serializers.ValidationError({"gpus": [
                f"A lead of tenant {tenant.slug} lets you hold at most {cap} GPU{'s' if cap != 1 else ''} there at "
                f"once; a job of {need_milli / 1000:g} could never start. Ask them to raise your limit."]})

    @staticmethod
    def _check_ceiling(attrs) -> None:
        """A job bigger than its tenant's ceiling would wait forever: refuse it, saying who can help.
        (Should an operator lower the ceiling later, the scheduler says so: ``over_max_gpus``.)"""
        tenant = attrs["tenant"]
        ceiling = max(tenant.max_gpus, tenant.guaranteed_gpus)
        need_milli = attrs["gpus"] * attrs.get("gpu_milli", 1000)
        if need_milli > ceiling * 1000:
            need = f"{need_milli / 1000:g}"
            raise serializers.ValidationError({"gpus": [
                f"Tenant {tenant.slug} may hold at most {ceiling} GPUs at once (its ceiling, max_gpus); a job "
                f"of {need} GPU{'' if need == '1' else 's'} could never start. An operator can raise the ceiling "
                "in the admin (Tenants)."
            ]})

    @staticmethod
    def _check_session(attrs) -> None:
        """An interactive session is one job on one node; its idle timeout travels in its launch env."""
        interactive, idle = attrs.pop("interactive", False), attrs.pop("idle_timeout_s", None)
        notebook = attrs.pop("notebook", False)
        if interactive and notebook:
            raise serializers.ValidationError({"notebook": ["A session is a terminal (interactive) or a notebook, "
                                                            "not both."]})
        interactive = interactive or notebook
        if not interactive:
            if idle is not None:
                raise serializers.ValidationError({"idle_timeout_s": ["Only for an interactive session."]})
            return
        if attrs.get("array", "").strip():
            raise serializers.ValidationError({"array": ["An interactive session is one job; leave out array."]})
        if attrs.get("image"):
            raise serializers.ValidationError({"image": ["Interactive sessions do not run in container images yet."]})
        if attrs.get("max_nodes") not in (None, 1):
            raise serializers.ValidationError({"max_nodes": ["An interactive session runs on one node."]})
        attrs["max_nodes"] = 1
        marker = tunnel_protocol.NOTEBOOK_IDLE_ENV if notebook else protocol.SESSION_IDLE_ENV
        attrs["env"] = {**(attrs.get("env") or {}), marker: str(idle or sessions.DEFAULT_IDLE_S)}

    @staticmethod
    def _check_launch_size(command: list[str], env: dict[str, str]) -> None:
        """Refuse a job whose command and env would not fit in the launch a node accepts."""
        size = launch_payload_bytes(command, env)
        if size <= MAX_LAUNCH_PAYLOAD_BYTES:
            return
        field = "command" if not env or launch_payload_bytes(command, {}) > MAX_LAUNCH_PAYLOAD_BYTES else "env"
        raise serializers.ValidationError({field: [
            f"The command and env together take {size} bytes in a launch; the most is "
            f"{MAX_LAUNCH_PAYLOAD_BYTES} bytes ({MAX_LAUNCH_PAYLOAD_BYTES // 1024} KiB). "
            "Pass large values in a file instead."
        ]})


def launch_payload_bytes(command: list[str], env: dict[str, str]) -> int:
    """What ``command`` and ``env`` take in an encoded launch (UTF-8 JSON, as the wire has it)."""
    return len(json.dumps({"argv": command, "env": env}, ensure_ascii=False, separators=(",", ":")).encode())


MAX_BULK_JOBS = 1000


@extend_schema_field(JobSubmitSerializer(many=True))
class JobSpecListField(serializers.ListField):
    """A list of job specs, each as ``POST /api/v1/jobs/`` takes it (checked one by one by the view,
    so that errors name the index)."""

    child = serializers.DictField()


class JobBulkSubmitSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    jobs = JobSpecListField(
        min_length=1, max_length=MAX_BULK_JOBS,
        help_text=f"1 to {MAX_BULK_JOBS} job specs, as POST /api/v1/jobs/ takes them (no `array`: submit arrays "
                  "there). The body may not exceed the API's body limit (COLONY_MAX_REQUEST_BYTES, 256 KiB by "
                  "default).",
        error_messages={"min_length": "Give at least one job.",
                        "max_length": f"At most {MAX_BULK_JOBS} jobs per request; send the rest in another."},
    )


class JobBulkCreatedSerializer(serializers.Serializer):
    jobs = serializers.ListField(child=serializers.IntegerField(), help_text="Ids of the jobs, in the order given.")


class JobBulkCancelSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),  # (a job id is a 64-bit integer)
        min_length=1, max_length=cancellation.MAX_JOBS,
        help_text="The jobs to cancel, e.g. [41, 42].",
        error_messages={"min_length": "Name at least one job.",
                        "max_length": f"At most {cancellation.MAX_JOBS:,} jobs at once."})


class SkippedJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    reason = serializers.CharField()


class JobBulkCancelledSerializer(serializers.Serializer):
    cancelled = serializers.ListField(child=serializers.IntegerField(), help_text="Were pending: cancelled now.")
    stopping = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Were placed or running: cancelling; their nodes were told to stop them.")
    skipped = SkippedJobSerializer(many=True, help_text="Left as they were, each with why.")
