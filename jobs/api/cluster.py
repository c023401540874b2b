"""REST API v1 views that join jobs to the inventory and metrics:

- ``/cluster/``: the overview (GPUs busy/shared/idle/lost, tenants against quota, queue, alerts);
- ``/metrics/occupancy/``: which jobs held each GPU over a heatmap range (for hover and click);
- ``/jobs/{id}/metrics/``: one job's GPU memory and utilisation over time.

Cluster-wide numbers are visible to everyone; a job is named only to users for whom
``Job.objects.visible_to(user)`` holds it. Anyone else reads "another tenant's job".
"""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from cluster_ui.api import tenancy
from jobs.api.tenants import TenantSerializer
from jobs.models import Job
from jobs.services.gpu_usage import gpu_counts, occupants, queue_stats
from jobs.services.usage_report import tenant_rows
from jobs.services.visibility import OTHER_TENANT, open_alerts, visible_job_ids
from monitoring.models import Gpu
from monitoring.services.heatmap import RANGES, job_series
from monitoring.services.live import live_summary


# ---------------------------------------------------------------- /cluster/


class GpuCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="Physical GPUs: one split into MIG instances counts once.")
    busy = serializers.IntegerField(help_text="Held by at least one job (shared ones included).")
    shared = serializers.IntegerField(help_text="Held by more than one job at once.")
    idle = serializers.IntegerField(help_text="On a live node and held by nobody.")
    lost = serializers.IntegerField(help_text="On a node whose agent stopped reporting.")
    cordoned_idle = serializers.IntegerField(help_text="Idle but on a cordoned node (not offered).")
    mig_instances = serializers.IntegerField(help_text="MIG instances of the GPUs above (a split GPU counts once).")
    mig_instances_busy = serializers.IntegerField(help_text="MIG instances held by a job.")


class QueueStatsSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    running = serializers.IntegerField()
    median_wait_s = serializers.FloatField(allow_null=True, help_text="Submit to placement, last 24 h.")
    oldest_pending_s = serializers.FloatField(allow_null=True)


class LiveSerializer(serializers.Serializer):
    gpus_reporting = serializers.IntegerField()
    util_mean = serializers.FloatField(allow_null=True, help_text="Mean SM utilisation now, percent.")
    mem_used_mib = serializers.IntegerField()
    mem_total_mib = serializers.IntegerField()


class AlertSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    kind_label = serializers.CharField()
    node = serializers.CharField()
    gpu_index = serializers.IntegerField(allow_null=True)
    job_id = serializers.IntegerField(allow_null=True, help_text="Only when you may see the job.")
    message = serializers.CharField()
    opened_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()


class ClusterSerializer(serializers.Serializer):
    gpus = GpuCountsSerializer()
    live = LiveSerializer()
    queue = QueueStatsSerializer()
    tenants = TenantSerializer(many=True)
    alerts = AlertSerializer(many=True)


class ClusterView(tenancy.APIView):
    queryset = Job.objects.all()  # whose alerts may name their job

    @extend_schema(responses=ClusterSerializer)
    def get(self, request):
        """The overview: GPU states now, live utilisation, the queue, tenants against quota, open alerts."""
        rows, context = tenant_rows(request.user)
        counts = gpu_counts()
        return Response({
            "gpus": GpuCountsSerializer(counts).data,
            "live": live_summary(),
            "queue": QueueStatsSerializer(queue_stats()).data,
            "tenants": TenantSerializer(rows, many=True, context=context).data,
            "alerts": open_alerts(self.queryset),
        })


# ---------------------------------------------------------------- /metrics/occupancy/


class OccupantSerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True, help_text="Null when it is another tenant's job.")
    name = serializers.CharField(allow_null=True)
    tenant = serializers.CharField(allow_null=True)
    label = serializers.CharField(help_text="What to show: '#12 train (vision)' or \"another tenant's job\".")
    gpu_milli = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(allow_null=True, help_text="Null while it still holds the GPU.")


class OccupancySerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpus = serializers.DictField(child=OccupantSerializer(many=True), help_text="GPU id -> its occupants.")


class OccupancyQuery(serializers.Serializer):
    range = serializers.ChoiceField(choices=list(RANGES), default="6h")
    node = serializers.ListField(child=serializers.CharField(max_length=63), required=False)


class OccupancyView(tenancy.APIView):
    queryset = Job.objects.all()  # the jobs it may name

    @extend_schema(
        parameters=[
            OpenApiParameter("range", str, enum=list(RANGES), description="Time range; default 6h."),
            OpenApiParameter("node", str, many=True, description="Only these nodes' GPUs."),
        ],
        responses=OccupancySerializer,
    )
    def get(self, request):
        """Which jobs held each GPU during the range (the heatmap's hover); other tenants' jobs unnamed."""
        params = {**request.query_params.dict()}
        if "node" in request.query_params:
            params["node"] = request.query_params.getlist("node")
        query = OccupancyQuery(data=params)
        query.is_valid(raise_exception=True)
        end = timezone.now()
        start = end - timedelta(seconds=RANGES[query.validated_data["range"]].seconds)
        gpu_ids = None
        if query.validated_data.get("node"):
            gpu_ids = list(Gpu.objects.filter(node__name__in=query.validated_data["node"]).values_list("pk", flat=True))
        held = occupants(start, end, gpu_ids)
        visible = visible_job_ids(self.queryset, [o.job_id for o in held])
        by_gpu: dict[str, list[dict]] = {}
        for o in held:
            seen = o.job_id in visible
            by_gpu.setdefault(str(o.gpu_id), []).append({
                "job": o.job_id if seen else None,
                "name": o.job_name if seen else None,
                "tenant": o.tenant if seen else None,
                "label": f"#{o.job_id} {o.job_name} ({o.tenant})" if seen else OTHER_TENANT,
                "gpu_milli": o.gpu_milli,
                "start": o.start,
                "end": o.end,
            })
        return Response({"start": start, "end": end, "gpus": by_gpu})


# ---------------------------------------------------------------- /jobs/{id}/metrics/


class SeriesPointSerializer(serializers.Serializer):
    t = serializers.DateTimeField()
    mem_max_mib = serializers.IntegerField(allow_null=True, help_text="Most memory on any of its GPUs.")
    util = serializers.FloatField(allow_null=True, help_text="Mean SM utilisation over its GPUs, percent.")


class JobSeriesSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    step_s = serializers.IntegerField()
    gpu_memory_mib = serializers.IntegerField(allow_null=True, help_text="What the job asked for per GPU.")
    peak_gpu_memory_mib = serializers.IntegerField(allow_null=True)
    points = SeriesPointSerializer(many=True)


class JobMetricsView(tenancy.APIView):
    queryset = Job.objects.all()

    @extend_schema(responses=JobSeriesSerializer)
    def get(self, request, pk: int):
        """One job's GPU memory and utilisation over its run (404 for jobs you may not see)."""
        job = get_object_or_404(self.queryset, pk=pk)
        begin = job.started_at or job.placed_at
        points, step = [], 10
        if begin is not None:
            step, series = job_series(job.pk, begin, job.finished_at or timezone.now())
            points = [{"t": p.t, "mem_max_mib": p.mem_max_mib, "util": p.util} for p in series]
        return Response({
            "job": job.pk, "step_s": step, "gpu_memory_mib": job.gpu_memory_mib,
            "peak_gpu_memory_mib": job.peak_gpu_memory_mib, "points": points,
        })
