"""Project-level pages: the overview, API tokens, API docs, and the Prometheus endpoint (the
heatmap and node pages are ``monitoring``'s, the job pages ``jobs``').

The overview's numbers are fetched by its script from the API (``/api/v1/cluster/``).
"""

import hmac

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from drf_spectacular.generators import SchemaGenerator

from cluster_ui import api_tokens as tokens
from cluster_ui.models import ApiToken
from jobs.metrics import JobsCollector
from monitoring.metrics import ClusterCollector, web_process_collectors


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
    for collector in web_process_collectors():  # HTTP requests and the web server's processes
        registry.register(collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@login_required
def overview(request):
    return render(request, "cluster_ui/overview.html")


@login_required
def api_tokens(request):
    """Your API tokens: make one (a name, days until it expires), see each one's state, revoke
    one. A new key is shown once, right after it is made (cluster_ui/api_tokens.py)."""
    new_key = None
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            try:
                days = int(request.POST.get("days") or tokens.default_days())
                _token, new_key = tokens.issue(request.user, request.POST.get("name", "").strip(), days)
                messages.success(request, "New API token created. Copy it now: it is not shown again.")
            except (ValueError, tokens.TooLong) as exc:
                messages.error(request, str(exc) if isinstance(exc, tokens.TooLong) else "Days must be a number.")
        elif action == "revoke":
            token = ApiToken.objects.filter(user=request.user, pk=request.POST.get("token") or 0).first()
            if token is not None and tokens.revoke(token, request.user):
                messages.success(request, f"API token …{token.ending} revoked: it no longer works.")
            return redirect("api-tokens")
    return render(request, "cluster_ui/tokens.html", {
        "tokens": ApiToken.objects.filter(user=request.user), "new_key": new_key,
        "default_days": tokens.default_days(), "max_days": tokens.max_days(),
        "api_url": request.build_absolute_uri("/"),
    })


# Endpoints whose views carry no docstring (the schema's description comes from it).
DOCS_FALLBACK = {
    ("post", "/api/v1/auth/token/"): "Username and password in, a new API token out (it expires).",
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
    return render(request, "cluster_ui/api_docs.html", {"endpoints": endpoints, "version": schema["info"]["version"]})
