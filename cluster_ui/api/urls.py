"""The REST API v1 root, mounted at /api/v1/: the token endpoints, the audit log, each app's
routes, and the browsable index (``api-root``), which lists the jobs app's collections as it always has."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter
from rest_framework.urlpatterns import format_suffix_patterns

from cluster_ui.api.audit import AuditEventListView
from cluster_ui.api.tokens import ObtainTokenView, TokenDetailView, TokenListView
from jobs.api.sessions import SessionInputView, SessionOutputView
from jobs.api.urls import router as jobs_router

index = DefaultRouter()
index.registry.extend(jobs_router.registry)

urlpatterns = [
    # With the API's parsers (cluster_ui.api.parsers), not DRF's plain ones that this view names itself.
    path("auth/token/", ObtainTokenView.as_view(), name="api-token"),
    path("auth/tokens/", TokenListView.as_view(), name="api-token-list"),
    path("auth/tokens/<int:pk>/", TokenDetailView.as_view(), name="api-token-detail"),
    path("audit/", AuditEventListView.as_view(), name="api-audit"),
    path("jobs/<int:pk>/session/input/", SessionInputView.as_view(), name="api-session-input"),
    path("jobs/<int:pk>/session/output/", SessionOutputView.as_view(), name="api-session-output"),
    path("", include("jobs.api.urls")),
    path("", include("monitoring.api.urls")),
    *format_suffix_patterns([path("", index.get_api_root_view(), name=index.root_view_name)]),
]
