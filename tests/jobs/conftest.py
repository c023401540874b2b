import pytest
from rest_framework.test import APIClient

from tests.factories import GpuFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory


@pytest.fixture
def vision(db):
    return TenantFactory(slug="vision")


@pytest.fixture
def alice(vision):
    """Owner of the jobs in permission tests."""
    return MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user


@pytest.fixture
def bob(vision):
    """Alice's teammate in the same tenant."""
    return MembershipFactory(user=UserFactory(username="bob"), tenant=vision).user


@pytest.fixture
def charlie(db):
    """An outsider in another tenant, who must see nothing of vision's."""
    return MembershipFactory(user=UserFactory(username="charlie"), tenant=TenantFactory(slug="nlp")).user


@pytest.fixture
def api():
    def client_for(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return client_for


@pytest.fixture
def inventory(db):
    """One node with 8 x 80 GiB GPUs and one with 4 x 32 GiB."""
    big, small = NodeFactory(name="big"), NodeFactory(name="small")
    gpus = [GpuFactory(node=big, index=i) for i in range(8)]
    gpus += [GpuFactory(node=small, index=i, model="V100-32GB", memory_mib=32768) for i in range(4)]
    return gpus
