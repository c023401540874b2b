"""Each cycle advances every tenant's decayed usage from the GPUs it holds now (the fair-share
order of borrowing reads it): held GPUs add usage, idle tenants' usage decays."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import JobState, RunClass
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


def test_a_borrower_on_an_over_committed_gpu_is_charged_its_share_as_the_scheduler_counts_it(db):
    """Two borrowers asking 800 milli each share one GPU: each tenant is charged 500 milli of it
    (``charged_milli``), while a guaranteed job and a borrower alone on its GPU count their request."""
    an_hour_ago = timezone.now() - timedelta(hours=1)
    tenants = {slug: TenantFactory(slug=slug, decayed_usage=0.0) for slug in ("nlp", "cv", "owner")}
    Tenant.objects.update(usage_updated_at=an_hour_ago)
    node = NodeFactory(name="n1")
    shared, alone = GpuFactory(node=node, index=0), GpuFactory(node=node, index=1)
    for slug in ("nlp", "cv"):
        job = JobFactory(tenant=tenants[slug], state=JobState.RUNNING, gpu_milli=800, run_class=RunClass.OPPORTUNISTIC)
        Allocation.objects.create(job=job, gpu=shared, gpu_milli=800)
    guaranteed = JobFactory(tenant=tenants["owner"], state=JobState.RUNNING, run_class=RunClass.GUARANTEED)
    Allocation.objects.create(job=guaranteed, gpu=alone, gpu_milli=700)
    lone_borrower = JobFactory(tenant=tenants["cv"], state=JobState.RUNNING, gpu_milli=300,
                               run_class=RunClass.OPPORTUNISTIC)
    Allocation.objects.create(job=lone_borrower, gpu=alone, gpu_milli=300)

    advance_usage(HALF_LIFE_S)

    usage = dict(Tenant.objects.values_list("slug", "decayed_usage"))
    assert usage["nlp"] == pytest.approx(decay_usage(0.0, 0.5, 3600, HALF_LIFE_S), rel=1e-3)
    assert usage["cv"] == pytest.approx(decay_usage(0.0, 0.8, 3600, HALF_LIFE_S), rel=1e-3)  # 500 + 300 alone
    assert usage["owner"] == pytest.approx(decay_usage(0.0, 0.7, 3600, HALF_LIFE_S), rel=1e-3)


def _charge_statements(captured) -> int:
    return sum("SUM(CASE WHEN" in query["sql"] for query in captured.captured_queries)


def test_what_tenants_hold_is_read_again_only_after_a_write_and_then_counted(transactional_db):
    """Every write commits on its own, as the loop's and the API's do: while no allocation or job
    was written since the last cycle, what each tenant holds is not summed again; after one is,
    the next cycle charges the new holding."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    tenant = TenantFactory(slug="vision", decayed_usage=0.0)
    node = NodeFactory(name="n1")
    gpus = [GpuFactory(node=node, index=i) for i in range(2)]
    first = JobFactory(tenant=tenant, state=JobState.RUNNING)
    Allocation.objects.create(job=first, gpu=gpus[0], gpu_milli=1000)
    advance_usage(HALF_LIFE_S)
    with CaptureQueriesContext(connection) as captured:
        advance_usage(HALF_LIFE_S)
    assert _charge_statements(captured) == 0

    second = JobFactory(tenant=tenant, state=JobState.RUNNING)
    Allocation.objects.create(job=second, gpu=gpus[1], gpu_milli=1000)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Tenant.objects.filter(pk=tenant.pk).update(decayed_usage=0.0, usage_updated_at=an_hour_ago)
    with CaptureQueriesContext(connection) as captured:
        advance_usage(HALF_LIFE_S)
    assert _charge_statements(captured) == 1
    tenant.refresh_from_db()
    assert tenant.decayed_usage == pytest.approx(decay_usage(0.0, 2.0, 3600, HALF_LIFE_S), rel=1e-3)
