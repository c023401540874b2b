"""The REST API v1 root, mounted at /api/v1/: the token endpoint, each app's routes, and the
browsable index (``api-root``), which lists the jobs app's collections as it always has."""

from django.urls import include, path
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.routers import DefaultRouter
from rest_framework.settings import api_settings
from rest_framework.urlpatterns import format_suffix_patterns

from jobs.api.urls import router as jobs_router

index = DefaultRouter()
index.registry.extend(jobs_router.registry)

urlpatterns = [
    # With the API's parsers (cluster_ui.api.parsers), not DRF's plain ones that this view names itself.
    path("auth/token/", ObtainAuthToken.as_view(parser_classes=api_settings.DEFAULT_PARSER_CLASSES),
         name="api-token"),
    path("", include("jobs.api.urls")),
    path("", include("monitoring.api.urls")),
    *format_suffix_patterns([path("", index.get_api_root_view(), name=index.root_view_name)]),
]
