"""Every registered API route, driven as alice (the owner), bob (her teammate) and charlie (an
outsider): none names alice's job to charlie, and each that serves jobs names it to alice and bob.

The routes are read from the URL resolver, not listed here, so a route added later is walked too;
and every API view either takes its tenancy from ``cluster_ui.api.tenancy`` (restricted or
declared cluster-wide) or serves only the requester's own things.
"""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import URLResolver, get_resolver
from rest_framework.routers import APIRootView
from rest_framework.test import APIRequestFactory, force_authenticate

from cluster_ui.api import tenancy
from cluster_ui.api.audit import AuditEventListView
from cluster_ui.api.tokens import ObtainTokenView, TokenDetailView, TokenListView
from jobs.api.code import CodeUploadView
from jobs.api.notifications import MyNotificationSettingsView, SendTestView
from jobs.choices import JobState
from jobs.models import Job
from monitoring.choices import AlertKind
from monitoring.models import Alert
from tests.factories import running_job
from tests.factories import JobFactory

SECRET_NAME = "alice-secret-sweep"
SECRET_ETA_ERROR = 31337.5  # shows in /eta-accuracy/ only to those who may see the job
MARKERS = (SECRET_NAME, str(SECRET_ETA_ERROR))

# Views that read no other user's rows: the token exchange, the index, your own uploads and settings.
# (The tokens' views: your own, or any for an operator; the audit log: operators only.)
OWN_THINGS_ONLY = {ObtainTokenView, TokenListView, TokenDetailView, AuditEventListView, APIRootView, CodeUploadView,
                   MyNotificationSettingsView, SendTestView}


def _walk(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.callback


def api_routes() -> list[tuple[str, type, list[str]]]:
    """(route, view class, HTTP methods) of everything under /api/v1/."""
    routes = []
    for route, callback in _walk(get_resolver().url_patterns):
        if not route.startswith("api/v1/"):
            continue
        view = callback.cls if hasattr(callback, "actions") else callback.view_class
        methods = list(callback.actions) if hasattr(callback, "actions") else [
            m for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)]
        routes.append((route, view, methods))
    return routes


ROUTES = api_routes()


def serves_jobs(view) -> bool:
    """(Views of memberships are narrowed by the same base; tests/jobs/test_roles.py covers them.)"""
    return (issubclass(view, tenancy.RestrictedMixin) and not view.cluster_wide
            and getattr(view.queryset, "model", None) is Job)


def url_for(route: str, *, job: Job, gpu_pk: int) -> str:
    """The route with its parameters filled in: alice's job, node a1, tenant vision, JSON format."""
    values = {"pk": str(job.pk), "name": "a1", "slug": "vision", "username": "alice", "format": "json"}
    if route.startswith("api/v1/^gpus/"):
        values["pk"] = str(gpu_pk)
    url = route.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")
    url = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values[m.group(1)], url)
    url = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], url)
    return "/" + url


def test_routes_are_found():
    found = {route for route, _, _ in ROUTES}
    assert {"api/v1/queue/", "api/v1/^jobs/(?P<pk>[^/.]+)/$", "api/v1/metrics/occupancy/"} <= found


@pytest.mark.parametrize("route, view", [(route, view) for route, view, _ in ROUTES],
                         ids=[route for route, _, _ in ROUTES])
def test_every_api_view_takes_its_tenancy_from_the_base(route, view):
    assert issubclass(view, tenancy.RestrictedMixin) or view in OWN_THINGS_ONLY, (
        f"{view.__name__} ({route}) must build on cluster_ui.api.tenancy: set queryset (narrowed with "
        "visible_to(user)) or cluster_wide = True")


@pytest.fixture
def alices_job(cluster, alice, vision):
    job = running_job(vision, alice, [cluster["a1/0"]], name=SECRET_NAME)
    Job.objects.filter(pk=job.pk).update(eta_error_s=SECRET_ETA_ERROR)
    Alert.objects.create(kind=AlertKind.MEMORY_OVER_REQUEST, node=cluster["a1/0"].node, gpu=cluster["a1/0"],
                         job_id=job.pk, message=f"Job {job.pk} ({SECRET_NAME}) uses more memory than it asked for",
                         opened_at=job.submitted_at, last_seen_at=job.submitted_at)
    return job


def by_job_id(route: str) -> bool:
    return route.startswith(("api/v1/^jobs/(?P<pk>", "api/v1/jobs/<int:pk>"))


def names_the_job(response, route: str) -> bool:
    body = response.content.decode()
    return any(marker in body for marker in MARKERS) or (by_job_id(route) and response.status_code == 200)


def test_no_get_route_shows_alices_job_to_an_outsider(alices_job, cluster, alice, bob, charlie, nlp, api,
                                                        live_redis):
    JobFactory(tenant=nlp, owner=charlie, name="charlies-own")  # so that charlie's lists are not empty
    shown = {"alice": set(), "bob": set(), "charlie": set()}
    for route, view, methods in ROUTES:
        if "get" not in methods:
            continue
        url = url_for(route, job=alices_job, gpu_pk=cluster["a1/0"].pk)
        for user in (alice, bob, charlie):
            response = api(user).get(url)
            assert response.status_code in (200, 404), (user.username, url, response.status_code)
            if names_the_job(response, route):
                shown[user.username].add(route)
        if by_job_id(route):
            assert api(charlie).get(url).status_code == 404, url
    assert shown["charlie"] == set()
    job_routes = {route for route, view, methods in ROUTES if "get" in methods and serves_jobs(view)}
    assert job_routes and shown["alice"] >= job_routes and shown["bob"] >= job_routes


def test_no_post_route_reaches_alices_job_for_an_outsider(alices_job, cluster, charlie, nlp, api):
    for route, view, methods in ROUTES:
        url = url_for(route, job=alices_job, gpu_pk=cluster["a1/0"].pk)
        if "post" not in methods or not serves_jobs(view):
            continue
        if by_job_id(route):  # an action on the job itself (cancel)
            assert api(charlie).post(url).status_code == 404, url
        else:  # a submission that names it as a dependency
            spec = {"command": ["true"], "gpus": 1, "after_ok": [alices_job.pk]}
            response = api(charlie).post(url, {"jobs": [spec]} if "bulk" in route else spec, format="json")
            assert response.status_code == 400, url
            assert not any(marker in response.content.decode() for marker in MARKERS)
    alices_job.refresh_from_db()
    assert alices_job.state == JobState.RUNNING
    assert not Job.objects.filter(owner=charlie).exists()


def test_a_view_that_names_no_rows_and_is_not_cluster_wide_refuses_to_answer(alice):
    class Forgetful(tenancy.APIView):
        def get(self, request):
            return None

    request = APIRequestFactory().get("/api/v1/forgetful/")
    force_authenticate(request, alice)
    with pytest.raises(ImproperlyConfigured):
        Forgetful.as_view()(request)
