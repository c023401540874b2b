"""The identity provider's POSIX account name (COLONY_OIDC_POSIX_CLAIM) becomes the account the
user's jobs run as on the nodes; a value that is no POSIX name is never taken."""

from __future__ import annotations

import pytest

from cluster_ui.sso.models import OidcIdentity
from tests.cluster_ui.sso.flow import sign_in, signed_in_user
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def vision():
    return TenantFactory(slug="vision", name="Vision Lab")


def posix_name(client) -> str:
    return OidcIdentity.objects.get(user=signed_in_user(client)).posix_name


def test_the_configured_claim_is_kept_as_the_users_posix_name_and_refreshed(client, sso, settings):
    settings.COLONY_OIDC_POSIX_CLAIM = "uid"
    sso.add_user("sub-alice", preferred_username="alice", uid="asmith", groups=["vision-researchers"])
    sign_in(client, sso, "sub-alice")
    assert signed_in_user(client).username == "alice" and posix_name(client) == "asmith"
    client.logout()
    sso.add_user("sub-alice", preferred_username="alice", uid="asmith2", groups=["vision-researchers"])
    sign_in(client, sso, "sub-alice")
    assert posix_name(client) == "asmith2"


@pytest.mark.parametrize("value", ["0", "a smith", "../root", "x" * 40, 1234])
def test_a_value_that_is_no_posix_name_is_not_taken(client, sso, settings, value):
    settings.COLONY_OIDC_POSIX_CLAIM = "uid"
    sso.add_user("sub-bob", preferred_username="bob", uid=value, groups=["vision-researchers"])
    sign_in(client, sso, "sub-bob")
    assert posix_name(client) == ""


def test_without_the_setting_no_posix_name_is_read(client, sso, settings):
    settings.COLONY_OIDC_POSIX_CLAIM = ""
    sso.add_user("sub-carol", preferred_username="carol", uid="cjones", groups=["vision-researchers"])
    sign_in(client, sso, "sub-carol")
    assert posix_name(client) == ""
