"""Tenancy applied once for the server-rendered pages, as :mod:`cluster_ui.api.tenancy` applies it
for the API: the same rule (the rows' ``visible_to(user)``), stated by each page in one of three ways.

- ``rows``: the queryset a page reads. It is narrowed to what the requesting user may see before
  the page's code runs, and the page reads only through it (``self.queryset`` in a class-based
  page, the ``rows`` argument of a function page): another tenant's job is a 404, never a 403.
- ``cluster_wide``: the page shows cluster-wide facts (nodes, GPUs, tenants' totals) and no
  job of anyone's, or names jobs only through a service that applies ``visible_to`` itself.
- ``own_things_only``: the page reads only the requester's own things (their form, their settings).

A page that says none of these, or whose rows have no ``visible_to``, fails when it is defined,
not when a user first opens it. tests/security/test_page_tenancy.py walks every page route and
refuses one that is not built on this.

It lives beside the API's base because ``cluster_ui.api`` is the one project-wide package both
apps may import (tests/test_import_direction.py); like it, it imports no app.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import ImproperlyConfigured


def _declared(owner: str, rows, cluster_wide: bool, own_things_only: bool) -> None:
    if cluster_wide or own_things_only:
        if rows is not None:
            raise ImproperlyConfigured(f"{owner} names rows and says it needs none: which is it?")
        return
    if not hasattr(rows, "visible_to"):
        raise ImproperlyConfigured(
            f"{owner} reads no rows with visible_to(user) and is neither cluster_wide nor own_things_only.")


class RestrictedPage(LoginRequiredMixin):
    """Mixed in before a generic view (``class JobDetailView(RestrictedPage, DetailView)``): the
    user is signed in, and ``self.queryset`` is narrowed to their rows before any handler runs, so
    Django's ``get_queryset``/``get_object`` (and the page's own code) start from it."""

    queryset = None
    cluster_wide = False
    own_things_only = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _declared(cls.__name__, cls.queryset, cls.cluster_wide, cls.own_things_only)

    def dispatch(self, request, *args, **kwargs):
        if not request.user.is_authenticated:
            return self.handle_no_permission()
        if self.queryset is not None:
            # On this instance (one per request), from a copy: the class's queryset must never
            # hold one request's rows in its cache for the next.
            self.queryset = self.queryset.all().visible_to(request.user)
        return super().dispatch(request, *args, **kwargs)


def page(*, rows=None, cluster_wide: bool = False, own_things_only: bool = False):
    """The same for a function page: signed in, and ``rows`` narrowed to the requesting user's
    passed to it as its ``rows`` argument (``@page(rows=Job.objects.all())``, then
    ``def cancel(request, pk, rows)``)."""

    def decorate(view):
        _declared(view.__qualname__, rows, cluster_wide, own_things_only)

        @wraps(view)
        def restricted(request, *args, **kwargs):
            if rows is not None:
                kwargs["rows"] = rows.all().visible_to(request.user)
            return view(request, *args, **kwargs)

        restricted.page_tenancy = "rows" if rows is not None else "cluster_wide" if cluster_wide else "own_things_only"
        return login_required(restricted)

    return decorate


def tenancy_of(view) -> str | None:
    """How a URL pattern's callback takes its tenancy from this module (``rows``, ``cluster_wide``,
    ``own_things_only``), or None where it does not."""
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        if not issubclass(view_class, RestrictedPage):
            return None
        return "rows" if view_class.queryset is not None else "cluster_wide" if view_class.cluster_wide \
            else "own_things_only"
    return getattr(view, "page_tenancy", None)
