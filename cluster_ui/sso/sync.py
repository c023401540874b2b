"""Bringing an SSO account's memberships and staff flag in line with what its IdP groups grant."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from jobs.choices import Role
from jobs.models import Membership, Tenant

from cluster_ui import api_tokens, audit
from cluster_ui.models import ApiToken
from cluster_ui.sso.group_map import Grants

log = logging.getLogger(__name__)


def granted_tenants(grants: Grants) -> dict[str, Tenant]:
    """The granted tenants that exist, by slug; a slug the mapping names but no tenant has is
    logged (an operator's typo, or a tenant not created yet) and grants nothing."""
    tenants = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=grants.tenants)}
    unknown = sorted(set(grants.tenants) - set(tenants))
    if unknown:
        log.warning("sso: the group mapping names tenant(s) %s that do not exist; they grant nothing", unknown)
    return tenants


def bring_in_line(user, grants: Grants, tenants: Mapping[str, Tenant]) -> list[str]:
    """Make ``user``'s memberships exactly the granted ones and ``is_staff`` the operator grant.

    Returns what changed, in words, for the log. Runs inside the caller's transaction.
    """
    wanted = {tenants[slug].pk: Role(role) for slug, role in grants.tenants.items() if slug in tenants}
    changes = []
    lost = False  # a tenant, the lead role or the operator flag: what the user's tokens held goes too
    for membership in Membership.objects.filter(user=user).select_related("tenant"):
        role = wanted.pop(membership.tenant_id, None)
        if role is None:
            membership.delete()
            changes.append(f"left {membership.tenant.slug}")
            lost = True
        elif membership.role != role:
            lost = lost or membership.role == Role.LEAD
            membership.role = role
            membership.save(update_fields=["role"])
            changes.append(f"now {role.value} in {membership.tenant.slug}")
    slugs = {tenant.pk: slug for slug, tenant in tenants.items()}
    for tenant_id, role in wanted.items():
        Membership.objects.create(user=user, tenant_id=tenant_id, role=role)
        changes.append(f"joined {slugs[tenant_id]} as {role.value}")
    if user.is_staff != grants.operator:
        user.is_staff = grants.operator
        user.save(update_fields=["is_staff"])
        changes.append("operator" if grants.operator else "no longer operator")
        lost = lost or not grants.operator
    if changes:
        log.info("sso: %s: %s", user.username, "; ".join(changes))
        audit.record(None, "sso.roles", user, changes=changes)
    if lost:
        # A token made under a role the IdP has since withdrawn must not outlive it.
        revoked = [token for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True)
                   if api_tokens.revoke(token, None)]
        if revoked:
            changes.append(f"{len(revoked)} API token(s) revoked")
    return changes
