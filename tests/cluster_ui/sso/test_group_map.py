"""The operator's group mapping: what a set of IdP groups grants, and mappings refused at start-up."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from cluster_ui.sso.group_map import claim_groups, parse_group_map
from jobs.choices import Role

MAPPING = parse_group_map(json.dumps({
    "vision-lab": {"tenant": "vision"},
    "vision-leads": {"tenant": "vision", "role": "lead"},
    "ml-platform": [{"tenant": "vision"}, {"tenant": "nlp", "role": "lead"}],
    "hpc-admins": {"role": "operator"},
}))


def test_tenant_roles_are_the_membership_roles():
    from cluster_ui.sso.group_map import TENANT_ROLES

    assert set(TENANT_ROLES) == set(Role.values)


def test_groups_grant_their_tenants_with_the_strongest_role_and_unmapped_groups_nothing():
    grants = MAPPING.resolve(["all-staff", "vision-leads", "ml-platform", "vision-lab"])
    assert grants.tenants == {"vision": "lead", "nlp": "lead"}
    assert not grants.operator
    assert grants.matched_groups == ("vision-leads", "ml-platform", "vision-lab")


def test_the_order_of_groups_does_not_change_the_role():
    assert (MAPPING.resolve(["vision-leads", "vision-lab"]).tenants
            == MAPPING.resolve(["vision-lab", "vision-leads"]).tenants)


def test_operator_is_cluster_wide():
    grants = MAPPING.resolve(["hpc-admins"])
    assert grants.operator and grants.tenants == {} and not grants.empty


def test_no_mapped_group_grants_nothing():
    assert MAPPING.resolve(["all-staff"]).empty
    assert MAPPING.resolve([]).empty
    assert parse_group_map("").resolve(["vision-lab"]).empty


def test_group_names_are_matched_exactly():
    assert MAPPING.resolve(["Vision-Lab", "vision-lab "]).empty


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"g": "vision"}', "a grant is an object"),
    ('{"g": []}', "grants nothing"),
    ('{"g": {"tenant": "vision", "role": "admin"}}', "role 'admin' is not one of researcher, lead, operator"),
    ('{"g": {"role": "lead"}}', "a lead grant names its tenant"),
    ('{"g": {"tenant": "vision", "role": "operator"}}', "operator is cluster-wide"),
    ('{"g": {"tenant": "vision", "rol": "lead"}}', "unknown key(s) ['rol']"),
])
def test_a_mistake_in_the_mapping_names_the_group_and_the_problem(text, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_group_map(text)
    assert message in str(raised.value)


def test_groups_are_read_from_a_list_a_single_string_or_a_nested_claim():
    assert claim_groups({"groups": ["a", "b", 3]}, "groups") == ["a", "b"]
    assert claim_groups({"groups": "a"}, "groups") == ["a"]
    assert claim_groups({"realm_access": {"roles": ["ops"]}}, "realm_access.roles") == ["ops"]
    assert claim_groups({"groups": {"a": 1}}, "groups") == []
    assert claim_groups({}, "groups") == []
    assert claim_groups({"realm_access": ["x"]}, "realm_access.roles") == []
