"""Project-level endpoints."""

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from jobs.metrics import JobsCollector
from monitoring.metrics import ClusterCollector


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
