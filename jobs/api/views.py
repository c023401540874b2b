"""REST API v1 for jobs. Every queryset starts from ``Job.objects.visible_to(user)``."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from jobs.api.errors import Conflict
from jobs.api.queue import JOB_FILTER_PARAMETERS, job_filter_from
from jobs.api.serializers import JobSerializer, JobSubmitSerializer
from jobs.models import Job
from jobs.services.submission import NotCancellable, cancel_job, submit_job


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                 viewsets.GenericViewSet):
    serializer_class = JobSerializer

    def get_queryset(self):
        jobs = (
            Job.objects.visible_to(self.request.user)
            .select_related("tenant", "owner")
            .prefetch_related("allocations__gpu__node", "events")
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
        job = submit_job(owner=request.user, **submission.validated_data)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        try:
            job = cancel_job(job)
        except NotCancellable as exc:
            raise Conflict(str(exc)) from exc
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

