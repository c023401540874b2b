"""Project-level pages: the overview, the cluster heatmap, nodes, API tokens, API docs, and the
Prometheus endpoint.

Cluster-wide facts (GPU states, tenants' totals, node inventory) are shown to every signed-in
user; a job is named only where ``Job.objects.visible_to(user)`` holds it, else it reads
"another tenant's job". Charts and live numbers are fetched by the page's script from the API.
"""

import hmac

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.authtoken.models import Token

from jobs.api.cluster import OTHER_TENANT, visible_job_ids
from jobs.metrics import JobsCollector
from jobs.services.usage import live_holders
from monitoring.api.views import live_gpus
from monitoring.metrics import ClusterCollector
from monitoring.models import Gpu, Node
from monitoring.services.heatmap import METRICS, RANGES


@require_GET
def prometheus_metrics(request):
    token = settings.COLONY_METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    registry.register(JobsCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@login_required
def overview(request):
    return render(request, "cluster/overview.html")


def _choice(value: str | None, allowed, default: str) -> str:
    return value if value in allowed else default


@login_required
def heatmap(request):
    return render(request, "cluster/heatmap.html", {
        "ranges": list(RANGES), "metrics": METRICS,
        "range": _choice(request.GET.get("range"), RANGES, "1h"),
        "metric": _choice(request.GET.get("metric"), METRICS, "util"),
    })


@login_required
def nodes(request):
    rows = Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.filter(present=True)))
    return render(request, "cluster/nodes.html", {"nodes": rows})


@login_required
def node_detail(request, name: str):
    node = get_object_or_404(Node, name=name)
    gpus = list(node.gpus.filter(present=True).order_by("index"))
    held = live_holders([gpu.pk for gpu in gpus])
    visible = visible_job_ids(request.user, [a.job_id for allocations in held.values() for a in allocations])
    readings = live_gpus()
    for gpu in gpus:
        gpu.live = readings.get(f"{node.name}:{gpu.index}")
        gpu.holders = [
            {"job": a.job if a.job_id in visible else None, "gpu_milli": a.gpu_milli, "duty_cycle": a.duty_cycle,
             "memory_limit_mib": a.memory_limit_mib, "since": a.created_at}
            for a in held.get(gpu.pk, [])
        ]
    return render(request, "cluster/node.html", {
        "node": node, "gpus": gpus, "other_tenant": OTHER_TENANT, "ranges": list(RANGES), "metrics": METRICS,
    })


@login_required
def api_tokens(request):
    """Create (or replace) and revoke your own API token. DRF keeps one token per user; the key is
    shown once, right after it is made."""
    new_key = None
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            Token.objects.filter(user=request.user).delete()
            new_key = Token.objects.create(user=request.user).key
            messages.success(request, "New API token created. Copy it now: it is not shown again.")
        elif action == "revoke":
            deleted, _ = Token.objects.filter(user=request.user).delete()
            messages.success(request, "API token revoked." if deleted else "You had no API token.")
            return redirect("api-tokens")
    token = Token.objects.filter(user=request.user).first()
    return render(request, "cluster/tokens.html", {
        "token": token, "new_key": new_key,
        "api_url": request.build_absolute_uri("/"),
    })


# Endpoints whose views carry no docstring (the schema's description comes from it).
DOCS_FALLBACK = {
    ("post", "/api/v1/auth/token/"): "Username and password in, your API token out.",
    ("get", "/api/v1/jobs/"): "Jobs you may see (filters: ?state=pending,running, ?tenant=), paginated.",
    ("post", "/api/v1/jobs/"): "Submit a job (throttled per user).",
    ("get", "/api/v1/jobs/{id}/"): "One job: state, pending reason, allocations, exit code, output tail.",
    ("post", "/api/v1/jobs/{id}/cancel/"): "Cancel a job; a running one is stopped on its node.",
}


@login_required
def api_docs(request):
    """The endpoints, read from the OpenAPI schema. (Swagger UI needs its assets served locally,
    from the drf-spectacular-sidecar package; until then this page and the raw schema stand in.)"""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    endpoints = [
        {"method": method.upper(), "path": path,
         "summary": (operation.get("description") or DOCS_FALLBACK.get((method, path), "")).split("\n")[0],
         "tag": (operation.get("tags") or [""])[0]}
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]
    return render(request, "cluster/api_docs.html", {"endpoints": endpoints, "version": schema["info"]["version"]})
