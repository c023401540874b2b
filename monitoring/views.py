"""Pages of the inventory: the cluster heatmap, the node list, one node.

Cluster-wide facts (GPU states, readings, node inventory) are shown to every signed-in user: each
page says so to the page base (:mod:`cluster_ui.api.pages`). The node page names the jobs on each
GPU only through :mod:`monitoring.services.gpu_holders`, which ``jobs`` fills in (only it can tell
whom a job may be named to). Charts and live numbers are fetched by the page's script from the API.
"""

from collections import Counter

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, render

from cluster_ui.api.pages import page
from monitoring.models import Gpu, Node
from monitoring.services import gpu_holders
from monitoring.services.gpu_totals import totals_of
from monitoring.services.heatmap import METRICS, RANGES
from monitoring.services.live import live_gpus


def _choice(value: str | None, allowed, default: str) -> str:
    return value if value in allowed else default


@page(cluster_wide=True)
def heatmap(request):
    return render(request, "monitoring/heatmap.html", {
        "ranges": list(RANGES), "metrics": METRICS,
        "range": _choice(request.GET.get("range"), RANGES, "1h"),
        "metric": _choice(request.GET.get("metric"), METRICS, "util"),
    })


@page(cluster_wide=True)
def nodes(request):
    rows = list(Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.filter(present=True))))
    for node in rows:
        # "8 mps", "7 mig, 1 unfenced": what sharing on each node risks, at a glance.
        node.isolation_counts = sorted(Counter(gpu.isolation for gpu in node.gpus.all()).items())
        # A GPU split into MIG instances is one GPU here, its instances named beside it.
        node.gpu_totals = totals_of(node.gpus.all())
    cluster = totals_of(gpu for node in rows for gpu in node.gpus.all())
    return render(request, "monitoring/nodes.html", {"nodes": rows, "totals": cluster})


@page(cluster_wide=True)
def node_detail(request, name: str):
    node = get_object_or_404(Node, name=name)
    gpus = list(node.gpus.filter(present=True).order_by("index"))
    held = gpu_holders.holders(request.user, [gpu.pk for gpu in gpus])
    readings = live_gpus()
    for gpu in gpus:
        gpu.live = readings.get(f"{node.name}:{gpu.index}")
        gpu.holders = held.get(gpu.pk, [])
    return render(request, "monitoring/node.html", {
        "node": node, "gpus": gpus, "ranges": list(RANGES), "metrics": METRICS,
    })
