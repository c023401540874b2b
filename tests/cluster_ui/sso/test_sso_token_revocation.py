"""A role the IdP takes away takes the user's API tokens with it (issue 38): a token made while
dan led vision stops working once a sign-in brings his roles in line with fewer groups."""

import pytest

from cluster_ui.models import ApiToken, AuditEvent
from tests.cluster_ui.sso.flow import sign_in, signed_in_user
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_sso_taking_a_role_away_revokes_the_users_tokens(client, sso, api):
    TenantFactory(slug="vision")
    sso.add_user("sub-dan", email="dan@example.org", groups=["vision-leads", "hpc-admins"])
    sign_in(client, sso, "sub-dan")
    dan = signed_in_user(client)
    made = api(dan).post("/api/v1/auth/tokens/", {}, format="json").json()
    client.logout()

    sso.add_user("sub-dan", email="dan@example.org", groups=["vision-researchers"])
    sign_in(client, sso, "sub-dan")
    assert not ApiToken.objects.get(pk=made["id"]).active
    assert AuditEvent.objects.filter(action="sso.roles").exists()
    assert AuditEvent.objects.filter(action="token.revoke", object_id=str(made["id"])).exists()


def test_a_sign_in_that_takes_nothing_away_keeps_the_tokens(client, sso, api):
    TenantFactory(slug="vision")
    sso.add_user("sub-eve", email="eve@example.org", groups=["vision-researchers"])
    sign_in(client, sso, "sub-eve")
    eve = signed_in_user(client)
    made = api(eve).post("/api/v1/auth/tokens/", {}, format="json").json()
    client.logout()
    sign_in(client, sso, "sub-eve")
    assert ApiToken.objects.get(pk=made["id"]).active
