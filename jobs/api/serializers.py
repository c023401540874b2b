"""REST representations of jobs; submission validation lives here and in the submit form."""

from __future__ import annotations

from rest_framework import serializers

from jobs.models import Job
from jobs.services.submission import tenants_of
from monitoring.services.registry import largest_placement

MAX_ARGV = 256
MAX_ARG_LENGTH = 4096


class RejectUnknownFieldsMixin:
    """A misspelt field (``gpu`` for ``gpus``) must fail loudly, not be silently dropped."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
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
    released_at = serializers.DateTimeField()


class PendingReasonSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    pending_reason = PendingReasonSerializer(read_only=True, allow_null=True)
    allocations = AllocationSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id", "name", "tenant", "owner", "command", "gpus", "gpu_memory_mib", "state", "pending_reason",
            "allocations", "exit_code", "error", "output_tail", "submitted_at", "placed_at", "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class JobSubmitSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False,
                                 help_text="Defaults to the program name in `command`.")
    command = serializers.ListField(
        child=StrictCharField(max_length=MAX_ARG_LENGTH, allow_blank=True, trim_whitespace=False),
        min_length=1, max_length=MAX_ARGV,
        help_text='argv list, run without a shell, e.g. ["python", "train.py", "--epochs", "3"].',
    )
    gpus = serializers.IntegerField(min_value=1, help_text="Whole GPUs, all on one node.")
    gpu_memory_mib = serializers.IntegerField(min_value=1, required=False, allow_null=True,
                                              help_text="GPU memory needed on each GPU, in MiB.")
    tenant = serializers.SlugField(required=False,
                                   help_text="Tenant to charge; optional when you belong to exactly one.")

    def validate_command(self, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise serializers.ValidationError("The program (first element) must not be blank.")
        return command

    def validate_tenant(self, slug: str):
        tenant = tenants_of(self.context["request"].user).filter(slug=slug).first()
        if tenant is None:
            # Same answer whether the tenant does not exist or is someone else's.
            raise serializers.ValidationError(f"Unknown tenant '{slug}', or you are not a member of it.")
        return tenant

    def validate(self, attrs):
        if "tenant" not in attrs:
            mine = list(tenants_of(self.context["request"].user)[:2])
            if not mine:
                raise serializers.ValidationError({"tenant": ["You are not a member of any tenant."]})
            if len(mine) > 1:
                raise serializers.ValidationError({"tenant": ["You belong to several tenants; say which one."]})
            attrs["tenant"] = mine[0]
        most_gpus, most_memory = largest_placement()
        if most_gpus and attrs["gpus"] > most_gpus:
            raise serializers.ValidationError(
                {"gpus": [f"No node has {attrs['gpus']} GPUs; the largest has {most_gpus}."]}
            )
        memory = attrs.get("gpu_memory_mib")
        if most_memory and memory and memory > most_memory:
            raise serializers.ValidationError(
                {"gpu_memory_mib": [f"No GPU has {memory} MiB; the largest has {most_memory} MiB."]}
            )
        attrs.setdefault("name", attrs["command"][0].rsplit("/", 1)[-1][:200])
        return attrs
