"""Each cycle advances every tenant's decayed usage from the GPUs it holds now (the fair-share
order of borrowing reads it): held GPUs add usage, idle tenants' usage decays."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Allocation, Tenant
from jobs.scheduling.usage import decay_usage
from jobs.services.fair_share import advance_usage
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory

HALF_LIFE_S = 7200.0


def test_usage_grows_with_what_a_tenant_holds_and_decays_without(db):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    busy = TenantFactory(slug="busy", decayed_usage=1000.0)
    idle = TenantFactory(slug="idle", decayed_usage=5000.0)
    TenantFactory(slug="new", decayed_usage=0.0)
    Tenant.objects.filter(pk__in=[busy.pk, idle.pk]).update(usage_updated_at=an_hour_ago)
    node = NodeFactory(name="n1")
    job = JobFactory(tenant=busy, gpus=2, state=JobState.RUNNING)
    for i in range(2):
        Allocation.objects.create(job=job, gpu=GpuFactory(node=node, index=i), gpu_milli=1000)
    released = JobFactory(tenant=idle, state=JobState.SUCCEEDED)
    Allocation.objects.create(job=released, gpu=GpuFactory(node=node, index=2), gpu_milli=1000,
                              released_at=an_hour_ago)

    advance_usage(HALF_LIFE_S)

    after = {t.slug: t for t in Tenant.objects.all()}
    assert after["busy"].decayed_usage == pytest.approx(decay_usage(1000.0, 2.0, 3600, HALF_LIFE_S), rel=1e-3)
    assert after["idle"].decayed_usage == pytest.approx(5000.0 / 2 ** 0.5, rel=1e-3)
    assert after["new"].decayed_usage == 0.0  # never advanced before: nothing elapsed
    assert len({t.usage_updated_at for t in after.values()}) == 1
    assert after["new"].usage_updated_at > an_hour_ago
