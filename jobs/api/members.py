"""REST API v1 /tenants/<slug>/members/: a tenant's members, their role, what they run now and the
limits a tenant lead set for them; a lead (or an operator) changes a member's limits with PATCH.

Members see only their own row; a lead sees the tenant's; someone outside the tenant gets a 404
(the tenant's existence is not secret, its members are). Roles come from the admin or the
identity provider's groups, never from here.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from cluster_ui.api import tenancy
from jobs.models import Membership, Tenant
from jobs.services import roles


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(source="membership.user.username", read_only=True)
    role = serializers.CharField(source="membership.role", read_only=True)
    running_jobs = serializers.IntegerField(read_only=True)
    gpus_held = serializers.FloatField(read_only=True)
    max_gpus = serializers.IntegerField(source="membership.max_gpus", read_only=True, allow_null=True)
    max_running_jobs = serializers.IntegerField(source="membership.max_running_jobs", read_only=True,
                                                allow_null=True)


class MemberLimitsSerializer(serializers.ModelSerializer):
    class Meta:
        model = Membership
        fields = ["max_gpus", "max_running_jobs"]
        extra_kwargs = {"max_gpus": {"max_value": 100_000}, "max_running_jobs": {"max_value": 100_000}}


class MembersView(tenancy.GenericAPIView):
    """The members of a tenant you belong to: all of them for its leads and operators, else yourself."""

    queryset = Membership.objects.all()
    serializer_class = MemberSerializer

    def tenant(self, slug: str) -> Tenant:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None or not self.queryset.filter(tenant=tenant).exists():
            raise NotFound(f"No tenant {slug}, or you are not a member of it.")
        return tenant

    @extend_schema(responses=MemberSerializer(many=True))
    def get(self, request, slug: str, format=None):
        tenant = self.tenant(slug)
        return Response(MemberSerializer(roles.members_now(tenant, self.queryset), many=True).data)


class MemberView(MembersView):
    @extend_schema(request=MemberLimitsSerializer, responses={200: MemberSerializer, 403: None})
    def patch(self, request, slug: str, username: str, format=None):
        tenant = self.tenant(slug)
        if not roles.leads(request.user, tenant.pk):
            raise PermissionDenied(f"Only a lead of tenant {tenant.slug} or an operator sets its members' limits.")
        membership = get_object_or_404(self.queryset, tenant=tenant, user__username=username)
        limits = MemberLimitsSerializer(membership, data=request.data, partial=True)
        limits.is_valid(raise_exception=True)
        limits.save()
        (row,) = roles.members_now(tenant, self.queryset.filter(pk=membership.pk))
        return Response(MemberSerializer(row).data)

    @extend_schema(responses=MemberSerializer)
    def get(self, request, slug: str, username: str, format=None):
        tenant = self.tenant(slug)
        membership = get_object_or_404(self.queryset, tenant=tenant, user__username=username)
        (row,) = roles.members_now(tenant, self.queryset.filter(pk=membership.pk))
        return Response(MemberSerializer(row).data)


urlpatterns = [
    path("tenants/<slug:slug>/members/", MembersView.as_view(), name="api-tenant-members"),
    path("tenants/<slug:slug>/members/<str:username>/", MemberView.as_view(), name="api-tenant-member"),
]
