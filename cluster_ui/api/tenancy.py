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

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if self.cluster_wide:
            return
        if not hasattr(self.queryset, "visible_to"):
            raise ImproperlyConfigured(
                f"{type(self).__name__} serves no rows with visible_to(user) and is not cluster_wide."
            )
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
