"""REST representations of nodes, GPUs and the heatmap matrix (cluster-wide, no job details)."""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.protocol import ISOLATION_MODES, JOB_FENCES
from monitoring.choices import NodeHealth
from monitoring.models import Gpu, Node


@extend_schema_field({"type": "string", "pattern": f"^({'|'.join(NodeHealth.values)})$", "readOnly": True})
class NodeStateField(serializers.CharField):
    """A pattern, not an enum: drf-spectacular would name an enum ``StateEnum`` and collide with the
    job ``state`` enum (ENUM_NAME_OVERRIDES in SPECTACULAR_SETTINGS would be the other way)."""


class LiveGpuSerializer(serializers.Serializer):
    """The GPU's latest sample as the agent sent it (absent when the node has not reported lately):
    ``monitoring.services.live.GpuReading``."""

    ts = serializers.FloatField(help_text="Unix time of the sample.")
    util_sm = serializers.FloatField(allow_null=True, help_text="SM utilisation, percent.")
    mem_used_mib = serializers.IntegerField(allow_null=True)
    mem_total_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)


class GpuSerializer(serializers.ModelSerializer):
    """One schedulable device: a whole GPU, or a MIG instance (``mig_profile``, ``parent_index``)."""

    node = serializers.CharField(source="node.name", read_only=True)
    isolation = serializers.ChoiceField(
        [(mode, mode) for mode in ISOLATION_MODES], read_only=True,
        help_text="How jobs sharing it are fenced: mps (CUDA MPS memory and compute limits), memory_limit (the "
                  "driver's per-job memory limit), mig (a MIG instance, one job at a time) or unfenced (nothing "
                  "enforced: only jobs that accept it share it).")
    live = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["id", "node", "index", "model", "memory_mib", "uuid", "isolation", "mig_profile", "parent_index",
                  "live"]
        read_only_fields = fields

    @extend_schema_field(LiveGpuSerializer(allow_null=True))
    def get_live(self, gpu) -> dict | None:
        reading = self.context.get("live", {}).get(f"{gpu.node.name}:{gpu.index}")
        return None if reading is None else asdict(reading)


class NodeSerializer(serializers.ModelSerializer):
    state = NodeStateField(read_only=True, help_text="UP while its agent reports; LOST when it stopped.")
    job_fences = serializers.ListField(
        child=serializers.ChoiceField([(fence, fence) for fence in JOB_FENCES]), allow_null=True, read_only=True,
        help_text="What fences every job on the node, as its agent registered it: cgroup (a cgroup of its own, "
                  "killed whole at its end), devices (it opens only its own GPUs), accounts (it runs as its "
                  "researcher's own account). Null: its agent does not report them (an older agent).")
    fencing = serializers.SerializerMethodField(
        help_text="fenced (every job has a cgroup and a device filter), unfenced (one of them is missing), or "
                  "unknown (not reported).")
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["name", "hostname", "state", "state_changed_at", "cordoned", "rack", "backend", "agent_version",
                  "registered_at", "job_fences", "fencing", "gpus"]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "enum": ["fenced", "unfenced", "unknown"], "readOnly": True})
    def get_fencing(self, node) -> str:
        return node.fencing.state

    @extend_schema_field(GpuSerializer(many=True))
    def get_gpus(self, node) -> list:
        present = [gpu for gpu in node.gpus.all() if gpu.present]
        return GpuSerializer(present, many=True, context=self.context).data


class HeatmapRowSerializer(serializers.Serializer):
    gpu_id = serializers.IntegerField()
    node = serializers.CharField()
    rack = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    memory_mib = serializers.IntegerField()
    mig_profile = serializers.CharField(allow_null=True, help_text="A MIG instance: its profile, e.g. 1g.10gb.")
    parent_index = serializers.IntegerField(allow_null=True, help_text="A MIG instance: the GPU it is carved from.")


class HeatmapTotalsSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(help_text="Physical GPUs: one split into MIG instances counts once.")
    mig_gpus = serializers.IntegerField(help_text="Of those, split into MIG instances.")
    mig_instances = serializers.IntegerField()
    label = serializers.CharField(help_text="'16 GPUs (4 split into 12 MIG instances)'.")


class HeatmapGroupSerializer(serializers.Serializer):
    node = serializers.CharField()
    rack = serializers.CharField()
    state = serializers.CharField()
    cordoned = serializers.BooleanField()
    first_row = serializers.IntegerField()
    rows = serializers.IntegerField()


class HeatmapSerializer(serializers.Serializer):
    """Documents the heatmap answer; the view builds it directly (it can hold ~10^5 numbers)."""

    range = serializers.CharField()
    metric = serializers.ChoiceField(choices=["util", "mem"])
    unit = serializers.CharField(help_text="'%' of SM time (util) or of the GPU's memory (mem).")
    column_s = serializers.IntegerField(help_text="Seconds per column.")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    columns = serializers.ListField(child=serializers.DateTimeField(), help_text="Start time of each column.")
    rows = HeatmapRowSerializer(many=True)
    groups = HeatmapGroupSerializer(many=True)
    totals = HeatmapTotalsSerializer(help_text="The rows' GPUs: MIG instances are rows, not GPUs.")
    values = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="rows x columns; null where no sample arrived.",
    )
