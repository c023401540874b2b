"""What a membership's role lets a user do, beyond seeing the tenant's jobs (which every member
does, ``Job.objects.visible_to``): a researcher cancels their own jobs; a tenant lead cancels any
job of the tenant and sets each member's limits there; an operator (staff) does everything."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q, Sum

from jobs.choices import Role
from jobs.models import Allocation, Job, Membership, Tenant
from jobs.services.lifecycle import LIVE


def leads(user, tenant_id: int) -> bool:
    """Does ``user`` manage ``tenant_id`` (a lead of it, or an operator)?"""
    return user.is_authenticated and (
        user.is_staff or Membership.objects.filter(user=user, tenant_id=tenant_id, role=Role.LEAD).exists())


def may_cancel(user, job: Job) -> bool:
    return job.owner_id == user.pk or leads(user, job.tenant_id)


def cancel_refused(job: Job) -> str:
    return (f"Only its owner ({job.owner.get_username()}), a lead of tenant {job.tenant.slug} or an operator "
            f"can cancel job {job.pk}.")


@dataclass(frozen=True)
class MemberNow:
    membership: Membership
    running_jobs: int
    gpus_held: float


def members_now(tenant: Tenant, memberships) -> list[MemberNow]:
    """``memberships`` of ``tenant`` with what each member runs there now (two queries)."""
    memberships = list(memberships.filter(tenant=tenant).select_related("user").order_by("user__username"))
    users = [m.user_id for m in memberships]
    running = dict(Job.objects.filter(tenant=tenant, owner_id__in=users, state__in=LIVE)
                   .values("owner_id").annotate(n=Count("pk")).values_list("owner_id", "n"))
    held = dict(Allocation.objects.filter(job__tenant=tenant, job__owner_id__in=users, released_at__isnull=True)
                .values("job__owner_id").annotate(milli=Sum("gpu_milli")).values_list("job__owner_id", "milli"))
    return [MemberNow(m, running.get(m.user_id, 0), (held.get(m.user_id) or 0) / 1000) for m in memberships]


def member_gpu_cap(user, tenant: Tenant) -> int | None:
    """The most GPUs a lead lets ``user`` hold at once in ``tenant`` (None: no limit)."""
    return (Membership.objects.filter(user=user, tenant=tenant).filter(~Q(max_gpus=None))
            .values_list("max_gpus", flat=True).first())
