from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

from cluster_ui.views import prometheus_metrics

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="jobs:queue", permanent=False), name="home"),
    path("jobs/", include("jobs.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("jobs.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("metrics", prometheus_metrics, name="prometheus-metrics"),
]
