"""factory_boy factories for the Django models, and small builders of running jobs and rollups."""

from datetime import datetime, timezone as dt_timezone

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.choices import RunClass, JobState
from jobs.models import Allocation, Job, JobWait, Membership, Tenant
from monitoring.models import Gpu, GpuRollup, Node

PASSWORD = "correct-horse-battery"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    @factory.post_generation
    def password(user, create, extracted, **kwargs):
        user.set_password(extracted or PASSWORD)
        if create:
            user.save(update_fields=["password"])


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
    guaranteed_gpus = 8
    max_gpus = 16


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job
        skip_postgeneration_save = True

    tenant = factory.SubFactory(TenantFactory)
    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"job{n}")
    command = ["python", "-c", "print(1)"]
    gpus = 1

    @factory.post_generation
    def pending_reason(job, create, reason, **kwargs):
        """``JobFactory(pending_reason={...})``: the verdict it waits under (its ``eta_at``, if
        any, stored as the ETA), as the scheduling loop would have stored it."""
        if reason is None:
            return
        reason = dict(reason)
        eta_at = reason.pop("eta_at", None)
        JobWait.objects.update_or_create(job=job, defaults={
            "reason": reason, "eta_at": None if eta_at is None else int(eta_at)})


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"node-{n}")
    registered_at = factory.LazyFunction(timezone.now)


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-test-{n}")
    model = "A100-80GB"
    memory_mib = 81920


def running_job(tenant, owner, gpus, *, run_class=RunClass.GUARANTEED, milli=1000, **fields):
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
