from django.urls import include, path
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.routers import DefaultRouter
from rest_framework.settings import api_settings

from jobs.api.code import CodeUploadView
from jobs.api.cluster import ClusterView, JobMetricsView, OccupancyView
from jobs.api.queue import EtaAccuracyView, QueueView
from jobs.api.tenants import TenantViewSet, UsageView
from jobs.api.views import JobViewSet

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("tenants", TenantViewSet, basename="tenant")

urlpatterns = [
    # With the API's parsers (jobs.api.parsers), not DRF's plain ones that this view names itself.
    path("auth/token/", ObtainAuthToken.as_view(parser_classes=api_settings.DEFAULT_PARSER_CLASSES),
         name="api-token"),
    path("code/", CodeUploadView.as_view(), name="api-code"),
    path("queue/", QueueView.as_view(), name="api-queue"),
    path("eta-accuracy/", EtaAccuracyView.as_view(), name="api-eta-accuracy"),
    path("cluster/", ClusterView.as_view(), name="api-cluster"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    path("metrics/occupancy/", OccupancyView.as_view(), name="api-occupancy"),
    path("jobs/<int:pk>/metrics/", JobMetricsView.as_view(), name="api-job-metrics"),
    path("", include("jobs.api.notifications")),
    path("", include("monitoring.api.urls")),
    path("", include(router.urls)),
]
