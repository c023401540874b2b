"""REST API v1 for jobs. Every queryset starts from ``Job.objects.visible_to(user)``, applied by
the base view (``cluster_ui.api.tenancy``) before any handler runs.

``POST /api/v1/jobs/bulk/`` submits up to ``MAX_BULK_JOBS`` jobs at once, all or none, each checked
as ``POST /api/v1/jobs/`` checks one; the submission throttle counts it as one submission.
``POST /api/v1/jobs/cancel/`` cancels many jobs in one request and one transaction.
"""

from __future__ import annotations

import contextlib
import re

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from agents import protocol
from cluster_ui import audit
from cluster_ui.api import tenancy
from cluster_ui.api.errors import Conflict
from jobs.api.queue import JOB_FILTER_PARAMETERS, job_filter_from
from jobs.api.serializers import (
    JobBulkCancelledSerializer,
    JobBulkCancelSerializer,
    JobBulkCreatedSerializer,
    JobBulkSubmitSerializer,
    JobSerializer,
    JobSubmitSerializer,
)
from jobs.choices import TERMINAL_STATES
from jobs.models import Allocation, Job, JobDependency, JobEvent
from jobs.services import cancellation, job_logs, roles
from jobs.services.submission import (
    NotCancellable,
    TooManyWaiting,
    cancel_job,
    submit_array,
    submit_job,
    submission_context,
    submit_many,
)
from monitoring.services.registry import cluster_inventory
from monitoring.services.redis_client import get_redis


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                 tenancy.GenericViewSet):
    queryset = Job.objects.all()
    serializer_class = JobSerializer
    # (a submission's dependencies are looked up with visible_to by JobSubmitSerializer itself)
    actions_reading_no_rows = frozenset({"create", "bulk"})

    def get_queryset(self):
        jobs = (
            super().get_queryset()
            .select_related("tenant", "owner", "code", "wait")
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
        submission = JobSubmitSerializer(data=request.data,
                                         context={"request": request, **submission_context(request.user)})
        submission.is_valid(raise_exception=True)
        if "array" in submission.validated_data:
            with _queue_full_is_400():
                group, jobs = submit_array(owner=request.user, **submission.validated_data)
            return Response({
                "array": {"id": group.pk, "name": group.name, "spec": group.spec, "size": group.size,
                          "max_running": group.max_running},
                "jobs": [job.pk for job in jobs],
            }, status=status.HTTP_201_CREATED)
        with _queue_full_is_400():
            job = submit_job(owner=request.user, **submission.validated_data)
        # Answered from the job just written rather than read back with every relation: a new job
        # has no allocations, and no dependencies unless it named some (its events are read).
        job._prefetched_objects_cache = {"allocations": _read(Allocation, []), "events": _read(JobEvent, job.timeline)}
        if not (submission.validated_data.get("after_ok") or submission.validated_data.get("after_any")):
            job._prefetched_objects_cache["dependencies"] = _read(JobDependency, [])
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobBulkSubmitSerializer, responses={
        201: JobBulkCreatedSerializer,
        400: OpenApiResponse(description='A job is invalid: {"error": {"fields": {"jobs": {"3": {"gpus": [...]}}}}} '
                                         "names each by its index; none was submitted."),
        413: OpenApiResponse(description="The body is over the API's body limit (256 KiB by default)."),
        429: OpenApiResponse(description="Over your submission rate (COLONY_SUBMIT_RATE, 120/min by default), "
                                         "where a bulk request counts as one submission."),
    })
    @action(detail=False, methods=["post"])
    def bulk(self, request, format=None):
        """Submit many jobs in one request, all or none: ``{"jobs": [spec, ...]}``, each spec as
        ``POST /api/v1/jobs/`` takes it, at most 1,000 jobs and within the API's body limit
        (``COLONY_MAX_REQUEST_BYTES``, 256 KiB by default: about 1,000 specs of a short command).
        Arrays are submitted with ``POST /api/v1/jobs/``. Counts as one submission against your
        submission rate (``COLONY_SUBMIT_RATE``, counted by the default throttle before this runs,
        as a single submission is: checking is the work). Answers the new jobs' ids in the order given."""
        envelope = JobBulkSubmitSerializer(data=request.data)
        envelope.is_valid(raise_exception=True)
        specs = envelope.validated_data["jobs"]
        # Read once for all the jobs: the same answers each job's check would read.
        context = {"request": request, **submission_context(request.user), "inventory": cluster_inventory()}
        validated, errors = [], {}
        for index, spec in enumerate(specs):
            if "array" in spec:
                errors[str(index)] = {"array": ["Submit arrays with POST /api/v1/jobs/."]}
                continue
            submission = JobSubmitSerializer(data=spec, context=context)
            if submission.is_valid():
                validated.append(submission.validated_data)
            else:
                errors[str(index)] = submission.errors
        if errors:
            raise ValidationError({"jobs": errors})
        with _queue_full_is_400():
            jobs = submit_many(owner=request.user, specs=validated)
        return Response({"jobs": [job.pk for job in jobs]}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobSerializer, 403: None, 409: None},
                   description="Its owner, a lead of its tenant or an operator may cancel a job.")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None, format=None):
        job = self.get_object()
        if not roles.may_cancel(request.user, job):
            raise PermissionDenied(roles.cancel_refused(job))
        try:
            job = cancel_job(job)
        except NotCancellable as exc:
            raise Conflict(str(exc)) from exc
        audit.jobs_cancelled(request.user, [job])  # (only someone else's job is written)
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=JobBulkCancelSerializer, responses={200: JobBulkCancelledSerializer},
                   operation_id="v1_jobs_cancel_many")
    @action(detail=False, methods=["post"], url_path="cancel")
    def cancel_many(self, request, format=None):
        """Cancel many jobs at once: ``{"ids": [41, 42, ...]}`` (at most 10,000). Each is cancelled
        as ``POST /api/v1/jobs/{id}/cancel/`` would (pending ones end now, running ones are
        stopped, and what ran ``after_ok`` them is cancelled down the chain), all in one
        transaction; those you may not cancel, that have ended, or that you cannot see are
        left as they are and listed under ``skipped`` with the reason."""
        body = JobBulkCancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        outcome = cancellation.cancel_jobs(request.user, self.queryset, body.validated_data["ids"])
        return Response({
            "cancelled": list(outcome.cancelled),
            "stopping": list(outcome.stopping),
            "skipped": [{"id": job_id, "reason": why} for job_id, why in outcome.skipped.items()],
        })


    @extend_schema(
        parameters=[
            OpenApiParameter("node", str, description="only this node's output (a multi-node job has one per node)"),
            OpenApiParameter("after", str,
                             description="entry id: only chunks stored after it (the previous answer's `next`)"),
        ],
        responses={200: None},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None, format=None):
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


def _read(model, rows: list):
    """A queryset of ``model`` already holding ``rows``, as ``prefetch_related`` leaves one: read
    without compiling a query (an empty ``none()`` compiles one to find it has nothing to run)."""
    queryset = model.objects.none()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    return queryset


@contextlib.contextmanager
def _queue_full_is_400():
    try:
        yield
    except TooManyWaiting as exc:
        raise ValidationError([str(exc)]) from None
