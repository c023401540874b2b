"""Server-rendered pages for researchers: queue, submit, job detail (with cancel), usage report.

Every page is built on :mod:`cluster_ui.api.pages`: the jobs a page shows or acts on are its
``rows``, narrowed to ``visible_to(request.user)`` before the page runs, so another tenant's job is
a 404 here exactly as in the API and no page writes its own filter. Pages render their first
state on the server and then poll the JSON API (``static/js/<page>.js``) to stay current.
"""

from __future__ import annotations

import csv
import math
from datetime import timedelta

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.generic import DetailView, FormView, ListView, TemplateView

from cluster_ui import audit
from cluster_ui.api.pages import RestrictedPage, page
from cluster_ui.api.throttles import SubmissionRateThrottle
from jobs.services import idle_reclaim, roles
from jobs.services.eta import eta_seconds
from jobs.services.eta_accuracy import eta_accuracy
from jobs.services.usage_report import MAX_REPORT_DAYS, usage_rows
from jobs.choices import CANCELLABLE_STATES, JobState, Role
from jobs.filtersets import JobFilter
from jobs.forms import SubmitForm
from jobs.models import Job, Membership, Tenant
from jobs.services.submission import NotCancellable, TooManyWaiting, cancel_job, submit_array, submit_job, tenants_of
from jobs.services.gpu_usage import queue_positions


# What a job row on a page shows with it (narrowed per request by the page base).
JOB_ROWS = Job.objects.select_related("tenant", "owner", "wait").prefetch_related("allocations__gpu__node")


def filter_tenants(user):
    """Tenants offered in the queue's filter: all for staff, one's own otherwise."""
    return Tenant.objects.order_by("slug") if user.is_staff else tenants_of(user).order_by("slug")


ETA_ACCURACY_DAYS = 7


class QueueView(RestrictedPage, ListView):
    queryset = JOB_ROWS
    template_name = "jobs/queue.html"
    context_object_name = "jobs"
    paginate_by = 50  # the API page size, so a live refresh shows the same rows

    def get_queryset(self):
        self.job_filter = JobFilter.from_params(self.request.GET, self.request.user)
        return self.job_filter.apply(super().get_queryset())

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        jobs = list(context["jobs"])
        positions = queue_positions([job.pk for job in jobs if job.state == JobState.PENDING])
        for job in jobs:
            job.queue_position, job.queue_length = positions.get(job.pk, (None, None))
            job.eta_s = eta_seconds(job)
            job.nodes = sorted({a.gpu.node.name for a in job.allocations.all() if a.released_at is None})
        context.update(
            jobs=jobs,
            tenants=filter_tenants(self.request.user),
            states=JobState.choices,
            selected={"tenant": self.request.GET.get("tenant", ""), "state": self.request.GET.get("state", ""),
                      "owner": self.request.GET.get("owner", "")},
            unknown_states=self.job_filter.unknown_states,
            eta_accuracy=eta_accuracy(self.queryset, timezone.now() - timezone.timedelta(days=ETA_ACCURACY_DAYS)),
            eta_accuracy_days=ETA_ACCURACY_DAYS,
        )
        return context


class SubmitView(RestrictedPage, FormView):
    # The form names jobs only as dependencies, which submission checks against the owner's tenants.
    own_things_only = True
    template_name = "jobs/submit.html"
    form_class = SubmitForm

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "request": self.request}

    def form_valid(self, form):
        throttle = SubmissionRateThrottle()
        if not throttle.allow_submission(self.request):
            wait = math.ceil(throttle.wait() or 1)
            form.add_error(None, f"You are submitting jobs faster than allowed; try again in {wait} s.")
            response = self.form_invalid(form)
            response.status_code, response["Retry-After"] = 429, str(wait)
            return response
        try:
            return self._submit(form)
        except TooManyWaiting as exc:
            form.add_error(None, str(exc))
            return self.form_invalid(form)

    def _submit(self, form):
        if "array" in form.validated:
            group, jobs = submit_array(owner=self.request.user, **form.validated)
            messages.success(self.request, f"Array {group.pk} submitted: {group.size} jobs ({jobs[0].pk}–{jobs[-1].pk})"
                                           + (f", at most {group.max_running} at once." if group.max_running else "."))
            return redirect("jobs:detail", pk=jobs[0].pk)
        job = submit_job(owner=self.request.user, **form.validated)
        messages.success(self.request, f"Job #{job.pk} {job.name} submitted to {job.tenant.slug}.")
        return redirect("jobs:detail", pk=job.pk)


TIMELINE = [
    ("submitted_at", "Submitted"),
    ("placed_at", "Placed on GPUs"),
    ("started_at", "Started"),
    ("finished_at", "Finished"),
]


def timeline_of(job) -> list[dict]:
    """The job's steps, oldest first, each with the time since the one before; a header step
    opens each attempt. Jobs from before events were recorded fall back to their timestamps."""
    events = list(job.events.all())
    if not events:
        steps = [{"label": label, "at": getattr(job, field), "message": ""}
                 for field, label in TIMELINE if getattr(job, field) is not None]
    else:
        steps, attempt = [], 0
        for event in events:
            if event.attempt != attempt:
                attempt = event.attempt
                steps.append({"attempt": attempt})
            steps.append({"label": event.get_kind_display(), "at": event.at, "message": event.message,
                          "kind": event.kind})
    previous = None
    for step in steps:
        if "at" in step:
            step["after"] = (step["at"] - previous) if previous else None
            previous = step["at"]
    if job.finished_at is None and previous is not None:
        steps.append({"label": "Now", "at": None, "after": timezone.now() - previous, "open": True})
    return steps


class JobDetailView(RestrictedPage, DetailView):
    # The archive's bytes stay in the database: the page names it, never reads it.
    queryset = JOB_ROWS.select_related("code", "array").defer("code__data")
    template_name = "jobs/detail.html"
    context_object_name = "job"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        job = self.object
        positions = queue_positions([job.pk])
        context.update(
            dependencies=list(job.dependencies.select_related("on").order_by("on_id")),
            timeline=timeline_of(job),
            # The current attempt's GPUs first, then each earlier attempt's.
            allocations=sorted(job.allocations.all(), key=lambda a: (-a.attempt, a.released_at is not None, a.rank,
                                                                     a.gpu.node.name, a.gpu.index)),
            can_cancel=job.state in CANCELLABLE_STATES and roles.may_cancel(self.request.user, job),
            queue_position=positions.get(job.pk, (None, None)),
            eta_s=eta_seconds(job),
        )
        idle = idle_reclaim.idle_state(job)
        context.update(idle=idle, idle_text=idle_reclaim.describe(idle) if idle else "")
        return context


@page(rows=Job.objects.select_related("owner", "tenant"))
@require_POST
def cancel(request, pk: int, rows):
    job = get_object_or_404(rows, pk=pk)
    if not roles.may_cancel(request.user, job):
        messages.error(request, f"Not cancelled: {roles.cancel_refused(job)}")
        return redirect("jobs:detail", pk=job.pk)
    try:
        job = cancel_job(job)
    except NotCancellable as exc:
        messages.error(request, f"Not cancelled: {exc}.")
    else:
        audit.jobs_cancelled(request.user, [job])  # (only someone else's job is written)
        if job.state == JobState.CANCELLED:
            messages.success(request, f"Job #{job.pk} cancelled.")
        else:
            messages.success(request, f"Stopping job #{job.pk}: its node was told to end it.")
    return redirect("jobs:detail", pk=job.pk)


def report_days(request) -> int:
    try:
        days = int(request.GET.get("days", 14))
    except ValueError:
        days = 14
    return min(max(days, 1), MAX_REPORT_DAYS)


class UsageView(RestrictedPage, TemplateView):
    cluster_wide = True  # GPU hours per tenant, as /api/v1/usage/ shows them: no job is named
    template_name = "jobs/usage.html"

    def get_context_data(self, **kwargs):
        days = report_days(self.request)
        rows = usage_rows(days)
        totals: dict[str, dict] = {}
        for row in rows:
            total = totals.setdefault(row["tenant"], {"tenant": row["tenant"], "guaranteed": 0.0,
                                                      "opportunistic": 0.0, "total": 0.0})
            total["guaranteed"] += row["guaranteed_gpu_hours"]
            total["opportunistic"] += row["opportunistic_gpu_hours"]
            total["total"] += row["total_gpu_hours"]
        return {
            **super().get_context_data(**kwargs),
            "days": days,
            "day_choices": [7, 14, 30, 90],
            "rows": [row for row in rows if row["total_gpu_hours"]],
            "totals": sorted(totals.values(), key=lambda t: -t["total"]),
            "since": timezone.now().date() - timedelta(days=days - 1),
        }


@page(cluster_wide=True)
def usage_csv(request):
    days = report_days(request)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="colony-gpu-hours-{days}d.csv"'
    writer = csv.writer(response)
    writer.writerow(["day", "tenant", "guaranteed_gpu_hours", "opportunistic_gpu_hours", "total_gpu_hours"])
    for row in usage_rows(days):
        writer.writerow([row["day"].isoformat(), row["tenant"], f"{row['guaranteed_gpu_hours']:.3f}",
                         f"{row['opportunistic_gpu_hours']:.3f}", f"{row['total_gpu_hours']:.3f}"])
    return response


@page(rows=Membership.objects.all())
def members(request, slug: str, rows):
    """A tenant lead's page: the tenant's members, what they run, and the limits the lead sets
    (``rows``: the memberships the user may see, which for a lead are the tenant's)."""
    tenant = get_object_or_404(Tenant, slug=slug)
    if not roles.leads(request.user, tenant.pk):
        raise Http404("No such tenant, or you do not lead it.")
    if request.method == "POST":
        membership = get_object_or_404(rows, tenant=tenant, user__username=request.POST.get("member", ""))
        limits = {}
        for field in ("max_gpus", "max_running_jobs"):
            text = request.POST.get(field, "").strip()
            if text and (not text.isdigit() or int(text) > 100_000):
                messages.error(request, f"Not saved: {field.replace('_', ' ')} must be a whole number, or empty.")
                return redirect("jobs:members", slug=slug)
            limits[field] = int(text) if text else None
        Membership.objects.filter(pk=membership.pk).update(**limits)
        messages.success(request, f"Limits of {membership.user.get_username()} in {tenant.slug} saved.")
        return redirect("jobs:members", slug=slug)
    led = Tenant.objects.all() if request.user.is_staff else Tenant.objects.filter(
        memberships__user=request.user, memberships__role=Role.LEAD)
    return render(request, "jobs/members.html", {
        "tenant": tenant, "led": list(led.order_by("slug")),
        "members": roles.members_now(tenant, rows)})
