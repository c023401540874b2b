"""REST API v1 /tenants and /usage: quotas and GPU use per tenant.

These are cluster-wide totals, visible to every signed-in user (that is how a researcher sees
whether the cluster is busy and who is borrowing). They are read-only: operators change quotas
(and the unfenced-sharing consent) in the admin, which records who changed what. No job detail appears here.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from cluster_ui.api import tenancy
from jobs.services.gpu_usage import TenantNow
from jobs.services.usage_report import MAX_REPORT_DAYS, tenant_rows, usage_rows


class TenantUsageSerializer(serializers.Serializer):
    guaranteed_gpus_used = serializers.FloatField(help_text="GPUs held by its guaranteed jobs now.")
    opportunistic_gpus_used = serializers.FloatField(help_text="GPUs borrowed (opportunistic jobs) now.")
    gpus_used = serializers.FloatField()
    running_jobs = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()


class TenantSerializer(serializers.Serializer):
    slug = serializers.CharField(source="tenant.slug")
    name = serializers.CharField(source="tenant.name")
    guaranteed_gpus = serializers.IntegerField(source="tenant.guaranteed_gpus")
    max_gpus = serializers.IntegerField(source="tenant.max_gpus")
    weight = serializers.FloatField(source="tenant.weight")
    unfenced_sharing = serializers.BooleanField(
        source="tenant.unfenced_sharing",
        help_text="Whether its jobs may share GPUs that enforce no memory or compute limits (isolation 'unfenced'), "
                  "guarded only by memory-pressure preemption; a job's accepts_unfenced overrides it. Operators "
                  "set it in the admin.")
    member = serializers.SerializerMethodField(help_text="Whether you belong to this tenant.")
    idle_policy = serializers.SerializerMethodField(
        help_text="Minutes a job's GPUs may sit idle before each step (null: that step is off), and the "
                  "utilisation under which a GPU counts as idle (null: the cluster's default).")
    usage = serializers.SerializerMethodField()

    @extend_schema_field(serializers.DictField(child=serializers.FloatField(allow_null=True)))
    def get_idle_policy(self, row: TenantNow) -> dict:
        tenant = row.tenant
        return {"notify_minutes": tenant.idle_notify_minutes,
                "opportunistic_minutes": tenant.idle_opportunistic_minutes,
                "suspend_minutes": tenant.idle_suspend_minutes, "requeue_minutes": tenant.idle_requeue_minutes,
                "util_percent": tenant.idle_util_percent}

    def get_member(self, row: TenantNow) -> bool:
        return row.tenant.pk in self.context.get("mine", set())

    @extend_schema_field(TenantUsageSerializer)
    def get_usage(self, row: TenantNow) -> dict:
        return TenantUsageSerializer({
            "guaranteed_gpus_used": round(row.guaranteed_gpus_used, 3),
            "opportunistic_gpus_used": round(row.opportunistic_gpus_used, 3),
            "gpus_used": round(row.gpus_used, 3),
            "running_jobs": row.running_jobs,
            "pending_jobs": row.pending_jobs,
        }).data


class TenantViewSet(tenancy.ViewSet):
    """Tenants with their quota (guarantee, ceiling, weight) and what they use now. Read-only."""

    cluster_wide = True

    lookup_field = "slug"
    serializer_class = TenantSerializer

    @extend_schema(responses=TenantSerializer(many=True))
    def list(self, request, format=None):
        rows, context = tenant_rows(request.user)
        return Response(TenantSerializer(rows, many=True, context=context).data)

    @extend_schema(responses=TenantSerializer, parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH)])
    def retrieve(self, request, slug=None, format=None):
        rows, context = tenant_rows(request.user)
        row = next((row for row in rows if row.tenant.slug == slug), None)
        if row is None:
            raise NotFound("No such tenant.")
        return Response(TenantSerializer(row, context=context).data)


class DayUsageSerializer(serializers.Serializer):
    day = serializers.DateField()
    tenant = serializers.CharField()
    guaranteed_gpu_hours = serializers.FloatField()
    opportunistic_gpu_hours = serializers.FloatField()
    total_gpu_hours = serializers.FloatField()


class UsageReportSerializer(serializers.Serializer):
    days = serializers.IntegerField()
    rows = DayUsageSerializer(many=True)


class UsageQuery(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=MAX_REPORT_DAYS, default=14)
    tenant = serializers.CharField(required=False)


class UsageAPIView(tenancy.APIView):
    cluster_wide = True

    @extend_schema(
        parameters=[
            OpenApiParameter("days", int, description=f"Days back, today included (1-{MAX_REPORT_DAYS}; default 14)."),
            OpenApiParameter("tenant", str, description="Tenant slug(s), comma-separated; default all."),
        ],
        responses=UsageReportSerializer,
    )
    def get(self, request):
        """GPU-hours per tenant per UTC day, split into guaranteed and opportunistic (borrowed) use."""
        query = UsageQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        days = query.validated_data["days"]
        return Response({"days": days, "rows": usage_rows(days, query.validated_data.get("tenant"))})
