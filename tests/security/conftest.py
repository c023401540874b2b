"""A seeded researcher with an API token, and a little cluster for the API to talk about."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token

from jobs.choices import RunClass, JobState
from jobs.models import Allocation
from tests.factories import GpuFactory, JobFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory


@pytest.fixture
def researcher(db):
    """alice in ``vision``, with a running and a pending job; charlie's job in ``nlp`` next door."""
    vision = TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=8)
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    nlp = TenantFactory(slug="nlp")
    charlie = MembershipFactory(user=UserFactory(username="charlie"), tenant=nlp).user
    node = NodeFactory(name="a1", rack="r1")
    gpus = [GpuFactory(node=node, index=i, uuid=f"GPU-a1-{i}") for i in range(2)]
    running = JobFactory(tenant=vision, owner=alice, state=JobState.RUNNING, run_class=RunClass.GUARANTEED)
    Allocation.objects.create(job=running, gpu=gpus[0], gpu_milli=1000)
    JobFactory(tenant=vision, owner=alice)
    JobFactory(tenant=nlp, owner=charlie)
    return alice


@pytest.fixture
def token(researcher) -> str:
    return Token.objects.create(user=researcher).key


def pytest_collection_modifyitems(items):
    """Schemathesis names each fuzz item ``test[GET /api/v1/jobs/]`` but, on pytest 9, gives them all
    the bare test's node id; give each its own, so that -v, --lf and reports tell them apart."""
    for item in items:
        if type(item).__name__ == "SchemathesisFunction" and hasattr(item, "_id") and item.name not in item.nodeid:
            item._id = item.parent.id.child(item.name)
