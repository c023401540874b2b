"""REST API v1 /queue: the jobs a user may see, with queue position, class, pending reason and ETA.

Like every job list it starts from ``Job.objects.visible_to(user)``; filters (``jobs.filtersets``)
only narrow it. The queue position is the job's place in its tenant's queue (priority, then
submit time: the order the scheduler takes a tenant's jobs in).
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from cluster_ui.api import tenancy
from jobs.api.serializers import PendingReasonSerializer
from jobs.choices import RunClass, JobState
from jobs.filtersets import JobFilter
from jobs.models import Job
from jobs.services.eta import eta_seconds
from jobs.services.eta_accuracy import eta_accuracy
from jobs.services.gpu_usage import queue_positions
from monitoring.models import JobUsage


JOB_FILTER_PARAMETERS = [
    OpenApiParameter("tenant", str, description="Tenant slug(s), comma-separated."),
    OpenApiParameter("state", str, description="State(s), comma-separated, or `active` / `finished`."),
    OpenApiParameter("owner", str, description="Username(s), comma-separated, or `me`."),
    OpenApiParameter("array", str, description="Array id(s), comma-separated: that array's jobs."),
    OpenApiParameter("name", str, description="Jobs whose name matches this shell-style pattern (`*`, `?`)."),
    OpenApiParameter("finished_after", str, description="Jobs that ended at or after this ISO 8601 time."),
    OpenApiParameter("ordering", str, enum=["-submitted_at", "-finished_at"],
                     description="Newest submitted first (default) or newest finished first."),
]


def job_filter_from(request) -> JobFilter:
    """The request's job filter; an unknown state or unreadable parameter is a 400 naming it."""
    job_filter = JobFilter.from_params(request.query_params, request.user)
    problems = {name: [why] for name, why in job_filter.problems.items()}
    if job_filter.unknown_states:
        problems["state"] = [
            f"Unknown state(s) {', '.join(job_filter.unknown_states)}; use "
            f"{', '.join(s.lower() for s in JobState.values)}, active or finished."
        ]
    if problems:
        raise serializers.ValidationError(problems)
    return job_filter


class QueueEntrySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    pending_reason = PendingReasonSerializer(read_only=True, allow_null=True)
    eta_s = serializers.SerializerMethodField(help_text="Seconds until it could start, when the scheduler knows.")
    queue_position = serializers.SerializerMethodField(help_text="1 = next in its tenant's queue (pending only).")
    queue_length = serializers.SerializerMethodField(help_text="Pending jobs in its tenant's queue.")
    nodes = serializers.SerializerMethodField(help_text="Nodes it holds GPUs on now.")
    mean_gpu_util = serializers.SerializerMethodField(
        help_text="Its GPUs' mean utilisation over its run so far, percent of a whole GPU; null before any sample.")
    run_class = serializers.ChoiceField(RunClass.choices, allow_blank=True, read_only=True,
                                        help_text="How it was admitted when placed; empty until then.")

    class Meta:
        model = Job
        fields = [
            "id", "name", "tenant", "owner", "state", "run_class", "gpus", "gpu_milli", "gpu_memory_mib",
            "gpu_models", "priority", "opportunistic_only", "pending_reason", "eta_s", "queue_position",
            "queue_length", "nodes", "requeue_count", "preempt_count", "array_id", "array_index", "exit_code",
            "peak_gpu_memory_mib", "mean_gpu_util", "submitted_at", "placed_at", "started_at", "finished_at",
        ]
        read_only_fields = fields

    def get_eta_s(self, job) -> float | None:
        return eta_seconds(job)

    def get_queue_position(self, job) -> int | None:
        return self.context.get("positions", {}).get(job.pk, (None, None))[0]

    def get_queue_length(self, job) -> int | None:
        return self.context.get("positions", {}).get(job.pk, (None, None))[1]

    def get_mean_gpu_util(self, job) -> float | None:
        return self.context.get("mean_util", {}).get(job.pk)

    def get_nodes(self, job) -> list[str]:
        return sorted({a.gpu.node.name for a in job.allocations.all() if a.released_at is None})


@extend_schema_view(get=extend_schema(parameters=JOB_FILTER_PARAMETERS))
class QueueAPIView(tenancy.ListAPIView):
    """Jobs you may see, newest first, each with its place in the queue and why it waits."""

    queryset = Job.objects.all()
    serializer_class = QueueEntrySerializer

    def get_queryset(self):
        return job_filter_from(self.request).apply(
            super().get_queryset()
            .select_related("tenant", "owner", "wait")
            .prefetch_related("allocations__gpu__node")
        )

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        ids = [job.pk for job in page]
        positions = queue_positions(ids)
        serializer = self.get_serializer(page, many=True, context={**self.get_serializer_context(),
                                                                    "positions": positions,
                                                                    "mean_util": mean_utilisation(ids)})
        return self.get_paginated_response(serializer.data)


def mean_utilisation(job_ids: list[int]) -> dict[int, float]:
    """Job id -> mean GPU utilisation (percent) over what its nodes reported, for those with samples."""
    return {job_id: round(util_sum / util_n, 1) for job_id, util_sum, util_n in
            JobUsage.objects.filter(job_id__in=job_ids, util_n__gt=0).values_list("job_id", "util_sum", "util_n")}


class EtaAccuracyView(tenancy.GenericAPIView):
    """How far the ETAs given to jobs you can see were off when those jobs started (first
    placement minus the first ETA; positive is late), over the last ``days`` (default 7)."""

    queryset = Job.objects.all()

    @extend_schema(parameters=[OpenApiParameter("days", int, description="1-90, default 7")],
                   responses={200: inline_serializer("EtaAccuracy", {
                       "days": serializers.IntegerField(), "jobs": serializers.IntegerField(),
                       "median_error_s": serializers.FloatField(allow_null=True),
                       "median_abs_error_s": serializers.FloatField(allow_null=True),
                       "p90_abs_error_s": serializers.FloatField(allow_null=True),
                       "late_share": serializers.FloatField(allow_null=True)})})
    def get(self, request):
        try:
            days = min(max(int(request.query_params.get("days", 7)), 1), 90)
        except ValueError:
            raise serializers.ValidationError({"days": ["A whole number of days, 1-90."]}) from None
        accuracy = eta_accuracy(self.get_queryset(), timezone.now() - timezone.timedelta(days=days))
        return Response({"days": days, **accuracy.as_dict()})
