"""Which Colony tenants and roles an identity provider's groups grant (docs/operations.md "Single sign-on").

The operator's mapping is JSON: each IdP group names one grant or a list of them::

    {"vision-lab":   {"tenant": "vision"},
     "vision-leads": {"tenant": "vision", "role": "lead"},
     "ml-platform":  [{"tenant": "vision"}, {"tenant": "nlp"}],
     "hpc-admins":   {"role": "operator"}}

``role`` is ``researcher`` (the default), ``lead`` (tenant lead) or ``operator`` (cluster-wide:
Django staff, no tenant). No Django import here: settings.py parses the mapping at start-up, so a
mistake in it stops the process with a message instead of refusing people one login at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured

RESEARCHER, LEAD, OPERATOR = "researcher", "lead", "operator"
TENANT_ROLES = (RESEARCHER, LEAD)  # jobs.choices.Role's values, weakest first
_RANK = {role: rank for rank, role in enumerate(TENANT_ROLES)}


@dataclass(frozen=True)
class Grants:
    """What a user's groups give them: a role per tenant slug, and whether they operate the cluster."""

    tenants: dict[str, str] = field(default_factory=dict)
    operator: bool = False
    matched_groups: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.tenants and not self.operator


@dataclass(frozen=True)
class GroupMap:
    entries: Mapping[str, tuple[tuple[str | None, str], ...]] = field(default_factory=dict)

    def resolve(self, groups: Iterable[str]) -> Grants:
        """The grants of every mapped group; one tenant reached twice keeps the stronger role."""
        tenants: dict[str, str] = {}
        operator = False
        matched = []
        for group in dict.fromkeys(groups):  # IdPs repeat groups; order kept for the message
            grants = self.entries.get(group)
            if grants is None:
                continue
            matched.append(group)
            for tenant, role in grants:
                if role == OPERATOR:
                    operator = True
                elif tenant not in tenants or _RANK[role] > _RANK[tenants[tenant]]:
                    tenants[tenant] = role
        return Grants(tenants=tenants, operator=operator, matched_groups=tuple(matched))


def parse_group_map(text: str, source: str = "COLONY_OIDC_GROUP_MAP") -> GroupMap:
    """The mapping from its JSON text; ImproperlyConfigured naming the bad entry otherwise."""
    if not text.strip():
        return GroupMap()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{source}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"{source}: must be a JSON object of group -> grant(s)")
    entries = {}
    for group, value in raw.items():
        grants = value if isinstance(value, list) else [value]
        if not grants:
            raise ImproperlyConfigured(f"{source}: group {group!r} grants nothing (an empty list)")
        entries[group] = tuple(_grant(source, group, grant) for grant in grants)
    return GroupMap(entries=entries)


def _grant(source: str, group: str, grant: object) -> tuple[str | None, str]:
    where = f"{source}: group {group!r}"
    if not isinstance(grant, dict):
        raise ImproperlyConfigured(f"{where}: a grant is an object like {{\"tenant\": \"vision\", \"role\": \"lead\"}}")
    unknown = set(grant) - {"tenant", "role"}
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown key(s) {sorted(unknown)} (use tenant, role)")
    role = grant.get("role", RESEARCHER)
    tenant = grant.get("tenant")
    if role == OPERATOR:
        if tenant is not None:
            raise ImproperlyConfigured(f"{where}: operator is cluster-wide; drop its tenant {tenant!r}")
        return None, OPERATOR
    if role not in TENANT_ROLES:
        raise ImproperlyConfigured(f"{where}: role {role!r} is not one of researcher, lead, operator")
    if not isinstance(tenant, str) or not tenant:
        raise ImproperlyConfigured(f"{where}: a {role} grant names its tenant (the tenant's slug)")
    return tenant, role


def claim_groups(claims: Mapping[str, object], claim: str) -> list[str]:
    """The groups in ``claim``: a list or a single string; a dotted name reaches into nested
    objects (Keycloak's ``realm_access.roles``). Absent or malformed: no groups."""
    value: object = claims
    for part in claim.split("."):
        if not isinstance(value, Mapping):
            return []
        value = value.get(part)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []
