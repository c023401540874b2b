"""Three users in every permission test (healthchecks' alice/bob/charlie): alice owns the jobs,
bob is her teammate in ``vision``, charlie is an outsider in ``nlp``; plus a staff operator."""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

import pytest
from rest_framework.test import APIClient

from jobs.choices import JobClass, JobState
from jobs.models import Allocation
from monitoring.models import GpuRollup
from tests.factories import GpuFactory, JobFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory


@pytest.fixture
def vision(db):
    return TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=8)


@pytest.fixture
def nlp(db):
    return TenantFactory(slug="nlp", guaranteed_gpus=2, max_gpus=6)


@pytest.fixture
def alice(vision):
    return MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user


@pytest.fixture
def bob(vision):
    return MembershipFactory(user=UserFactory(username="bob"), tenant=vision).user


@pytest.fixture
def charlie(nlp):
    return MembershipFactory(user=UserFactory(username="charlie"), tenant=nlp).user


@pytest.fixture
def operator(db):
    return UserFactory(username="operator", is_staff=True, is_superuser=True)


@pytest.fixture
def api():
    def client_for(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return client_for


@pytest.fixture
def web(client):
    """Django's test client, logged in as the given user."""

    def client_for(user):
        client.force_login(user)
        return client

    return client_for


@pytest.fixture
def cluster(db):
    """Two nodes: ``a1`` (rack r1) with 4 x A100-80GB, ``v1`` (rack r2) with 2 x V100-32GB."""
    a1, v1 = NodeFactory(name="a1", rack="r1"), NodeFactory(name="v1", rack="r2")
    gpus = {f"a1/{i}": GpuFactory(node=a1, index=i, uuid=f"GPU-a1-{i}") for i in range(4)}
    gpus |= {f"v1/{i}": GpuFactory(node=v1, index=i, uuid=f"GPU-v1-{i}", model="V100-32GB", memory_mib=32768)
             for i in range(2)}
    return gpus


def running_job(tenant, owner, gpus, *, run_class=JobClass.GUARANTEED, milli=1000, **fields):
    job = JobFactory(tenant=tenant, owner=owner, state=JobState.RUNNING, run_class=run_class, gpus=len(gpus),
                     gpu_milli=milli, **fields)
    for gpu in gpus:
        Allocation.objects.create(job=job, gpu=gpu, gpu_milli=milli)
    return job


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=dt_timezone.utc)


def rollup(gpu, start: datetime, util: float | None, mem: int | None = None, resolution: int = 10) -> GpuRollup:
    return GpuRollup.objects.create(
        gpu=gpu, resolution=resolution, bucket_start=start, samples=1,
        util_sum=util or 0.0, util_n=0 if util is None else 1, util_max=util,
        mem_sum=mem or 0, mem_n=0 if mem is None else 1, mem_max=mem,
    )
