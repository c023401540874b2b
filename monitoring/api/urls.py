from django.urls import include, path
from rest_framework.routers import SimpleRouter

from monitoring.api.views import GpuViewSet, HeatmapView, NodeViewSet

router = SimpleRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")

urlpatterns = [
    path("metrics/heatmap/", HeatmapView.as_view(), name="api-heatmap"),
    path("", include(router.urls)),
]
