"""REST API v1 for jobs. Every queryset starts from ``Job.objects.visible_to(user)``."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from agents import protocol
from jobs.api.errors import Conflict
from jobs.api.queue import JOB_FILTER_PARAMETERS, job_filter_from
from jobs.api.serializers import JobSerializer, JobSubmitSerializer
from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from jobs.services import job_logs
from jobs.services.submission import NotCancellable, cancel_job, submit_array, submit_job
from monitoring.services.redis_client import get_redis


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                 viewsets.GenericViewSet):
    serializer_class = JobSerializer

    def get_queryset(self):
        jobs = (
            Job.objects.visible_to(self.request.user)
            .select_related("tenant", "owner", "code")
            .defer("code__data")
            .prefetch_related("allocations__gpu__node", "events", "dependencies")
        )
        if self.action == "list":
            jobs = job_filter_from(self.request).apply(jobs)
        return jobs

    @extend_schema(parameters=JOB_FILTER_PARAMETERS)
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def create(self, request, *args, **kwargs):
        submission = JobSubmitSerializer(data=request.data, context={"request": request})
        submission.is_valid(raise_exception=True)
        if "array" in submission.validated_data:
            group, jobs = submit_array(owner=request.user, **submission.validated_data)
            return Response({
                "array": {"id": group.pk, "name": group.name, "spec": group.spec, "size": group.size,
                          "max_running": group.max_running},
                "jobs": [job.pk for job in jobs],
            }, status=status.HTTP_201_CREATED)
        job = submit_job(owner=request.user, **submission.validated_data)
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        try:
            job = cancel_job(job)
        except NotCancellable as exc:
            raise Conflict(str(exc)) from exc
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)


    @extend_schema(
        parameters=[
            OpenApiParameter("node", str, description="only this node's output (a multi-node job has one per node)"),
            OpenApiParameter("after", str, description="entry id: only chunks stored after it (the previous answer's `next`)"),
        ],
        responses={200: None},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """Live output of the job while it runs: chunks each node shipped, oldest first, newer
        than ``after``; ``nodes`` lists the nodes that sent output. Kept per node for the last
        256 KiB or so, for a day after the job's last output; a finished job's ``output_tail``
        stays on the job itself."""
        job = self.get_object()
        node, after = request.query_params.get("node"), request.query_params.get("after")
        if node is not None and not protocol.NODE_NAME_RE.match(node):
            raise ValidationError({"node": "not a node name"})
        if after and not re.match(job_logs.ENTRY_ID_RE, after):
            raise ValidationError({"after": "not an entry id (like 1700000000000-0)"})
        client = get_redis()
        nodes = job_logs.log_nodes(client, job.pk)
        wanted = [node] if node is not None else nodes
        chunks = job_logs.read_chunks(client, job.pk, [name for name in wanted if name in nodes], after or None)
        return Response({
            "id": job.pk,
            "state": job.state,
            "finished": job.state in TERMINAL_STATES,
            "nodes": nodes,
            "chunks": [{"id": c.id, "node": c.node, "launch_id": c.launch_id, "offset": c.offset, "gap": c.gap,
                        "data": c.data} for c in chunks],
            "next": chunks[-1].id if chunks else (after or None),
        })
