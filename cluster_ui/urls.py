from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from cluster_ui import views

urlpatterns = [
    path("", views.overview, name="home"),
    path("", include("monitoring.urls")),
    path("account/tokens/", views.api_tokens, name="api-tokens"),
    path("jobs/", include("jobs.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("sso/", include("cluster_ui.sso.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("cluster_ui.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", views.api_docs, name="api-docs"),
    path("api/swagger/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-swagger"),
    path("metrics", views.prometheus_metrics, name="prometheus-metrics"),
]
