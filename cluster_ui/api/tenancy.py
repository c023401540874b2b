"""Tenancy applied once, for every API view that serves rows (NetBox's ``BaseViewSet.initial``
calling ``queryset.restrict(user)``).

A view names the rows it serves with ``queryset``; before any handler runs, :meth:`initial`
narrows it to what the requesting user may see with the queryset's ``visible_to(user)``
(``Job.objects.visible_to``), so handlers start from ``self.queryset`` (or ``get_queryset()``)
and none writes its own filter. A view of cluster-wide facts (nodes, GPUs, tenants' totals) says
so with ``cluster_wide = True``. A view that says neither, or whose rows have no ``visible_to``,
fails rather than serve rows unfiltered.

Nothing here imports an app: ``jobs`` and ``monitoring`` build their API views on it.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from rest_framework import generics, views, viewsets


class RestrictedMixin:
    queryset = None
    cluster_wide = False
    # Viewset actions that read no row through the view's queryset (a submission, say): for them
    # it is left empty instead of narrowed, which costs a submission 0.2 ms for nothing. A read
    # through it would find no row, never another tenant's.
    actions_reading_no_rows: frozenset[str] = frozenset()

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if self.cluster_wide:
            return
        if not hasattr(self.queryset, "visible_to"):
            raise ImproperlyConfigured(
                f"{type(self).__name__} serves no rows with visible_to(user) and is not cluster_wide."
            )
        if getattr(self, "action", None) in self.actions_reading_no_rows:
            self.queryset = self.queryset.none()
            return
        # On this instance (DRF makes one per request), from a copy: the class's queryset must
        # never hold one request's rows in its cache for the next (staff are shown it unfiltered).
        self.queryset = self.queryset.all().visible_to(request.user)


class APIView(RestrictedMixin, views.APIView):
    pass


class GenericAPIView(RestrictedMixin, generics.GenericAPIView):
    pass


class ListAPIView(RestrictedMixin, generics.ListAPIView):
    pass


class ViewSet(RestrictedMixin, viewsets.ViewSet):
    pass


class GenericViewSet(RestrictedMixin, viewsets.GenericViewSet):
    pass


class ReadOnlyModelViewSet(RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    pass
