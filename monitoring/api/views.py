"""REST API v1 for the inventory and GPU metrics: nodes, GPUs, the GPU x time heatmap.

All of it is cluster-wide and visible to every signed-in user; nothing here names a job (which job
held a GPU is served by ``jobs``, which alone can tell who may see it).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from cluster_ui.api import tenancy
from monitoring.api.serializers import GpuSerializer, HeatmapSerializer, NodeSerializer
from monitoring.models import Gpu, Node
from monitoring.services.heatmap import METRICS, RANGES, gpu_heatmap
from monitoring.services.live import live_gpus


class NodeViewSet(tenancy.ReadOnlyModelViewSet):
    """Nodes with their present GPUs and each GPU's latest reading."""

    cluster_wide = True
    serializer_class = NodeSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = None

    def get_queryset(self):
        return Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index")))

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "live": live_gpus()}


@extend_schema(parameters=[OpenApiParameter("node", str, description="Only this node's GPUs.")])
class GpuViewSet(tenancy.ReadOnlyModelViewSet):
    """Present GPUs with their latest reading."""

    cluster_wide = True
    serializer_class = GpuSerializer

    def get_queryset(self):
        gpus = Gpu.objects.filter(present=True).select_related("node").order_by("node__name", "index")
        node = self.request.query_params.get("node")
        return gpus.filter(node__name=node) if node else gpus

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "live": live_gpus()}


class HeatmapQuery(serializers.Serializer):
    range = serializers.ChoiceField(choices=list(RANGES), default="6h")
    metric = serializers.ChoiceField(choices=list(METRICS), default="util")
    node = serializers.ListField(child=serializers.CharField(max_length=63), required=False)


class HeatmapView(tenancy.APIView):
    cluster_wide = True

    @extend_schema(
        parameters=[
            OpenApiParameter("range", str, enum=list(RANGES), description="Time range; default 6h."),
            OpenApiParameter("metric", str, enum=list(METRICS), description="util (SM %) or mem (% of GPU memory)."),
            OpenApiParameter("node", str, many=True, description="Only these nodes (repeat for several)."),
        ],
        responses=HeatmapSerializer,
    )
    def get(self, request):
        """GPU x time matrix of utilisation or memory, rows grouped by rack and node."""
        query = HeatmapQuery(data={
            **request.query_params.dict(),
            **({"node": request.query_params.getlist("node")} if "node" in request.query_params else {}),
        })
        query.is_valid(raise_exception=True)
        heatmap = gpu_heatmap(query.validated_data["range"], query.validated_data["metric"],
                              nodes=query.validated_data.get("node"))
        step = timedelta(seconds=heatmap.column_s)
        return Response({
            "range": heatmap.range_key,
            "metric": heatmap.metric,
            "unit": "%",
            "column_s": heatmap.column_s,
            "start": heatmap.start,
            "end": heatmap.end,
            "columns": [heatmap.start + step * n for n in range(heatmap.columns)],
            "rows": [asdict(row) for row in heatmap.rows],
            "groups": [asdict(group) for group in heatmap.groups],
            "totals": heatmap.totals.as_dict(),
            "values": heatmap.values,
        })
