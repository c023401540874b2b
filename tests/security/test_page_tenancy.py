"""Every page of ``jobs`` and ``monitoring``, driven as alice (the owner), bob (her teammate),
charlie (an outsider) and an operator: none names alice's job to charlie, a page or form that
takes her job's id is a 404 to him (GET and POST alike), and every page takes its tenancy from
:mod:`cluster_ui.api.pages` (the pages' twin of tests/cluster_ui/test_api_tenancy.py).

The routes are read from the URL resolver, not listed here, so a page added later is walked too.
"""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory
from django.urls import URLResolver, get_resolver
from django.views.generic import TemplateView

from cluster_ui.api import pages
from jobs.choices import JobState
from jobs.models import Job, JobEvent, Membership, Tenant
from monitoring.choices import AlertKind
from monitoring.models import Alert
from tests.factories import JobFactory, running_job

SECRET_NAME = "alice-secret-page-sweep"
SECRET_OUTPUT = "alice-secret-output-line"
SECRET_EVENT = "alice-secret-timeline-step"
MARKERS = (SECRET_NAME, SECRET_OUTPUT, SECRET_EVENT)


def _walk(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.callback


def _module_of(callback) -> str:
    return getattr(callback, "view_class", callback).__module__


def page_routes() -> list[tuple[str, object]]:
    """(route, callback) of every page whose view lives in ``jobs`` or ``monitoring`` (the API's
    routes have their own walk)."""
    return [(route, callback) for route, callback in _walk(get_resolver().url_patterns)
            if not route.startswith("api/") and _module_of(callback).split(".")[0] in ("jobs", "monitoring")]


ROUTES = page_routes()


def url_for(route: str, job: Job) -> str:
    values = {"pk": str(job.pk), "name": "a1", "slug": "vision"}
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], route)


def takes_the_job(route: str) -> bool:
    return "<int:pk>" in route


def test_the_walk_finds_the_pages():
    found = {route for route, _ in ROUTES}
    assert {"jobs/", "jobs/<int:pk>/", "jobs/<int:pk>/cancel/", "nodes/<str:name>/",
            "jobs/members/<slug:slug>/"} <= found


@pytest.mark.parametrize("route, callback", ROUTES, ids=[route for route, _ in ROUTES])
def test_every_page_takes_its_tenancy_from_the_base(route, callback):
    assert pages.tenancy_of(callback), (
        f"{route} must build on cluster_ui.api.pages: RestrictedPage or @page, with rows narrowed by "
        "visible_to(user), or cluster_wide / own_things_only")


@pytest.fixture
def alices_job(cluster, alice, vision):
    job = running_job(vision, alice, [cluster["a1/0"]], name=SECRET_NAME, output_tail=SECRET_OUTPUT)
    JobEvent.objects.create(job=job, attempt=1, kind="started", at=job.submitted_at, message=SECRET_EVENT)
    Alert.objects.create(kind=AlertKind.MEMORY_OVER_REQUEST, node=cluster["a1/0"].node, gpu=cluster["a1/0"],
                         job_id=job.pk, message=f"Job {job.pk} ({SECRET_NAME}) uses more memory than it asked for",
                         opened_at=job.submitted_at, last_seen_at=job.submitted_at)
    return job


def test_no_page_shows_alices_job_to_an_outsider(alices_job, alice, bob, charlie, operator, nlp, web, live_redis):
    JobFactory(tenant=nlp, owner=charlie, name="charlies-own")  # so that charlie's lists are not empty
    shown = {"alice": set(), "bob": set(), "charlie": set(), "operator": set()}
    for route, _ in ROUTES:
        url = url_for(route, alices_job)
        for user in (alice, bob, charlie, operator):
            response = web(user).get(url)
            assert response.status_code in (200, 302, 404, 405), (user.username, url, response.status_code)
            if any(marker in response.content.decode(errors="replace") for marker in MARKERS):
                shown[user.username].add(route)
        if takes_the_job(route):
            assert web(charlie).get(url).status_code in (404, 405), url
    assert shown["charlie"] == set()
    # The job's own page names it, its output and its timeline to everyone who may see it.
    for username in ("alice", "bob", "operator"):
        assert {"jobs/", "jobs/<int:pk>/", "nodes/<str:name>/"} <= shown[username], username


def test_no_page_form_reaches_alices_job_for_an_outsider(alices_job, alice, charlie, web):
    answers = {route: web(charlie).post(url_for(route, alices_job)).status_code
               for route, _ in ROUTES if takes_the_job(route)}  # its cancel form, and any later form on one job
    # 404 where the page takes a POST, 405 where it takes none: never a form that acts.
    assert set(answers.values()) <= {404, 405}, answers
    assert answers["jobs/<int:pk>/cancel/"] == 404
    alices_job.refresh_from_db()
    assert alices_job.state == JobState.RUNNING


def test_an_outsider_and_a_teammate_cannot_set_a_tenants_member_limits(alices_job, alice, bob, charlie, web):
    for user in (charlie, bob):  # bob is alice's teammate but does not lead vision
        response = web(user).post("/jobs/members/vision/", {"member": "alice", "max_gpus": "1"})
        assert response.status_code == 404, user.username
        assert "alice" not in response.content.decode()
    assert Membership.objects.get(user=alice, tenant__slug="vision").max_gpus is None


def test_a_page_that_names_no_rows_and_is_not_cluster_wide_is_refused_when_defined():
    with pytest.raises(ImproperlyConfigured):
        class Forgetful(pages.RestrictedPage, TemplateView):
            template_name = "jobs/queue.html"
    with pytest.raises(ImproperlyConfigured):
        @pages.page()
        def forgetful(request):
            return None
    with pytest.raises(ImproperlyConfigured):  # rows that cannot be narrowed
        @pages.page(rows=Tenant.objects.all())
        def unnarrowed(request, rows):
            return None


def test_a_page_reads_only_the_rows_the_requester_may_see(alices_job, charlie, nlp, operator):
    theirs = JobFactory(tenant=nlp, owner=charlie)

    @pages.page(rows=Job.objects.all())
    def listing(request, rows):
        return sorted(rows.values_list("pk", flat=True))

    request = RequestFactory().get("/probe/")
    request.user = charlie
    assert listing(request) == [theirs.pk]
    request.user = operator
    assert listing(request) == sorted([alices_job.pk, theirs.pk])
    # And the class's rows are never narrowed for good: the next request starts from all of them.

    class Probe(pages.RestrictedPage, TemplateView):
        queryset = Job.objects.all()

        def get(self, request):
            return sorted(self.queryset.values_list("pk", flat=True))

    request.user = charlie
    assert Probe.as_view()(request) == [theirs.pk]
    request.user = operator
    assert Probe.as_view()(request) == sorted([alices_job.pk, theirs.pk])
