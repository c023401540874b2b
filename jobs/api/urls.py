"""The jobs app's REST API v1 routes (mounted under /api/v1/ by ``cluster_ui.api.urls``)."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from jobs.api.cluster import ClusterView, JobMetricsView, OccupancyView
from jobs.api.code import CodeUploadView
from jobs.api.queue import EtaAccuracyView, QueueAPIView
from jobs.api.tenants import TenantViewSet, UsageAPIView
from jobs.api.views import JobViewSet

# DefaultRouter for its ``.json`` format suffixes; the index at /api/v1/ is the project's.
router = DefaultRouter()
router.include_root_view = False
router.register("jobs", JobViewSet, basename="job")
router.register("tenants", TenantViewSet, basename="tenant")

urlpatterns = [
    path("code/", CodeUploadView.as_view(), name="api-code"),
    path("queue/", QueueAPIView.as_view(), name="api-queue"),
    path("eta-accuracy/", EtaAccuracyView.as_view(), name="api-eta-accuracy"),
    path("cluster/", ClusterView.as_view(), name="api-cluster"),
    path("usage/", UsageAPIView.as_view(), name="api-usage"),
    path("metrics/occupancy/", OccupancyView.as_view(), name="api-occupancy"),
    path("jobs/<int:pk>/metrics/", JobMetricsView.as_view(), name="api-job-metrics"),
    path("", include("jobs.api.notifications")),
    path("", include("jobs.api.members")),
    path("", include(router.urls)),
]
