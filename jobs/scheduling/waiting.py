"""What a job that cannot start now is told, and the gang hold it may take.

Part of ``cycle.Cycle``: it reads the cycle's fixed inputs (capacity, placer, quotas, clock), its
``state`` (what each tenant holds, the hold) and its ``memo`` (under ``Memo``'s rule). The reasons for a
tenant at its ceiling, for a job that found no GPUs (held nodes, guaranteed but full, spare
capacity gone to lower-usage tenants, over quota and cluster full), the ETA attached to each, and
the one bounded reservation per cycle (rules in ``reservation``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from operator import itemgetter

from jobs.scheduling import reasons
from jobs.scheduling.carry import Entry
from jobs.scheduling.decisions import Reservation, new_pending
from jobs.scheduling.eta import ReleaseTimeline
from jobs.scheduling.filters import host_resources
from jobs.scheduling.placement import Shape
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.reservation import may_backfill, nodes_to_hold, window
from jobs.scheduling.snapshot import JobClass, JobRequest, TenantQuota
from jobs.scheduling.usage import weighted_share

GUARANTEED = JobClass.GUARANTEED
_first, _second = itemgetter(0), itemgetter(1)


class Waiting:
    def _all_at_ceiling(self, queue: list[Entry], position: int, quota: TenantQuota) -> None:
        """Every job of ``queue`` from ``position`` on waits for its tenant's ceiling: what each is
        told depends only on the milli-GPUs it needs."""
        by_need = self._ceiling_waits(quota.name)
        handled, pending = self.state.handled, self.state.pending
        if self.settle_in_bulk:
            columns = self.carry.queues[quota.name].columns_of()
            ids, needs = columns.ids[position:], columns.needs[position:]
            if handled.isdisjoint(ids):
                # (tens of thousands of jobs at their ceiling, a handful of needs: C-level maps)
                for need in dict.fromkeys(needs):  # (each distinct need once, in queue order)
                    if need not in by_need:
                        self._ceiling_wait(quota, need)
                found = list(map(by_need.__getitem__, needs))
                pending.extend(map(new_pending, zip(ids, map(_first, found), map(_second, found))))
                return
        for job, _, need, _, _ in queue[position:]:
            if job.id in handled:
                continue
            found = by_need.get(need)
            if found is None:
                found = self._ceiling_wait(quota, need)
            pending.append(new_pending((job.id, *found)))

    def _ceiling_waits(self, tenant: str) -> dict[int, tuple[PendingReason, float | None]]:
        """What a job of ``tenant`` asking N milli-GPUs past its ceiling is told, at what it holds now."""
        return self.memo.ceiling_waits.setdefault((tenant, self.state.held[tenant]), {})

    def _ceiling_wait(self, quota: TenantQuota, need: int) -> tuple[PendingReason, float | None]:
        name, ceiling = quota.name, quota.ceiling_milli
        held = self.state.held[name]
        eta = self._tenant_timeline(name).eta(held + need - ceiling)
        found = self._ceiling_waits(name)[need] = (reasons.at_max_gpus(name, held, ceiling, need), eta)
        return found

    def _tenant_timeline(self, tenant: str) -> ReleaseTimeline:
        if not self.memo.timelines:
            # The cycle's releases (all tenants' in time order), each tenant's apart, less the
            # jobs told to stop by now.
            by_tenant: dict[str, list] = defaultdict(list)
            leaving = self.state.leaving
            for release in self.releases:
                if release[3] not in leaving:
                    by_tenant[release[2]].append(release)
            self.memo.timelines = {t: ReleaseTimeline((), self.now, found) for t, found in by_tenant.items()}
        if tenant not in self.memo.timelines:
            self.memo.timelines[tenant] = ReleaseTimeline([], self.now)
        return self.memo.timelines[tenant]

    def _reason(self, build, *args) -> PendingReason:
        """Reasons are frozen and many jobs share one: build each distinct sentence once."""
        key = (build, *args)
        reason = self.memo.reasons.get(key)
        if reason is None:
            reason = self.memo.reasons[key] = build(*args)
        return reason

    def _blocked(self, job: JobRequest, shape: Shape, job_class: JobClass) -> PendingReason:
        """A job that fits the inventory and its quota found no GPUs: say why, maybe reserve."""
        if self.state.holder is None and job.gpus > 1 and (held := self._hold(job, shape)) is not None:
            return held
        if self.state.holder is not None and self._fits_reserved(shape, job_class):
            holder, nodes, _ = self.state.holder
            reason = self._reason(reasons.reserved_for_gang, holder.id, holder.gpus, nodes)
        elif shape.needs_host and (short := self._host_shortage(shape, job_class)) is not None:
            needed = (shape.cpu_per_gpu if short == "cpu" else shape.host_mb_per_gpu) * job.gpus
            reason = self._reason(reasons.insufficient_host, short, job.gpus, needed)
        elif job_class is GUARANTEED:
            pools = self.placer.pools_for(shape)
            most_free = self.capacity.most_free_on_a_node(pools)
            if self.state.holder is not None and may_backfill(job, self.state.holder[2]):
                # (a node held for a gang is out of the indexes, but this job may backfill it)
                for by_model in self.placer.pools_by_model(pools):
                    for node in self.state.reserved_nodes:
                        most_free = max(most_free, sum(1 for g in node.empty if g.pool in by_model))
            reason = self._reason(reasons.waiting_for_free_gpus, job.gpus, shape.memory_mib, shape.max_nodes == 1,
                                  most_free)
        elif job.opportunistic_only and self.state.held[job.tenant] + job.quota_milli <= self.quota(job.tenant).guaranteed_milli:
            reason = self._reason(reasons.no_spare_capacity, job.gpus)
        elif self._lower_usage_borrowing(job.tenant):
            reason = self._reason(reasons.behind_lower_usage, job.tenant, self._start_share(job.tenant))
        else:
            quota = self.quota(job.tenant)
            unused = quota.guaranteed_milli - self.state.guaranteed_held[job.tenant]
            reason = self._reason(reasons.over_quota_cluster_full, job.tenant, quota.guaranteed_milli, unused, job.gpus)
        self._wait(job, reason, self.queue_eta.next(job.quota_milli))
        return reason

    def _host_shortage(self, shape: Shape, job_class: JobClass) -> str | None:
        """Would GPUs be found if the request asked no CPU or host memory? Then say which of the two
        the nodes with those GPUs lack ("cpu" or "memory")."""
        known = self.memo.now(self.state.version)
        key = ("host", shape, job_class)
        if key not in known:
            # One plain shape per shape (the placer's caches key on identity), and a plain request
            # that found nothing finds nothing for the rest of the cycle (capacity only shrinks).
            plain = self.carry.plain_shapes.get(shape)
            if plain is None:
                plain = self.carry.plain_shapes[shape] = replace(shape, cpu_per_gpu=0, host_mb_per_gpu=0)
            tag = ("host", job_class)
            choice = None if self.memo.failed.fails(tag, plain) else self.placer.find(plain, job_class, [])
            if choice is None:
                self.memo.failed.record(tag, plain)
            known[key] = None if choice is None else next(
                (short for node, gpus in choice.slices
                 if (short := host_resources.shortage([node], shape.cpu_per_gpu, shape.host_mb_per_gpu, len(gpus)))),
                None)
        return known[key]

    def _hold(self, job: JobRequest, shape: Shape) -> PendingReason | None:
        span = window(job, self.now, self.config.gang_reservation_max_s)
        if span is None or self.memo.failed.fails("hold", shape):
            return None
        found = nodes_to_hold(self.capacity, self.placer, shape, self.now, self.state.leaving)
        if found is None:
            self.memo.failed.record("hold", shape)
            return None
        nodes, eta = found
        for node in nodes:
            self.capacity.reserve(node)
        names = tuple(node.name for node in nodes)
        self.state.reserved_nodes = nodes
        self.state.holder = (job, names, eta)
        self.state.version += 1
        self.state.reservations.append(Reservation(job.id, names, since=span[0], until=span[1], eta_s=eta))
        reason = reasons.holding_reservation(job.gpus, names, span[1], self.now)
        self._wait(job, reason, eta)
        return reason

    def _fits_reserved(self, shape: Shape, job_class: JobClass) -> bool:
        """Would the job fit on the held nodes? (then the hold is what keeps it waiting)"""
        if self.memo.not_on_reserved.fails(job_class, shape):
            return False
        key = (job_class, shape)
        fits = self.memo.fits_reserved.get(key)
        if fits is None:
            fits = self.memo.fits_reserved[key] = self.placer.fits_on(self.state.reserved_nodes, shape, job_class)
            if not fits:
                self.memo.not_on_reserved.record(job_class, shape)
        return fits

    def _lower_usage_borrowing(self, tenant: str) -> bool:
        """Does a tenant ahead of ``tenant`` in the borrowing order (lower weighted usage at the
        start of the cycle, a tie by name) hold borrowed GPUs: opportunistic jobs still running, or
        placed this cycle? A fact about the cluster, not about this cycle's few placements, so the
        verdict it gives stays put from one cycle to the next while the cluster does."""
        key = (tenant, len(self.state.borrowing_tenants))  # (borrowers only join within a cycle)
        found = self.memo.lower_borrowing.get(key)
        if found is None:
            mine = (self._start_share(tenant), tenant)
            found = self.memo.lower_borrowing[key] = any(
                (self._start_share(other), other) < mine
                for other in self.borrowing_at_start | self.state.borrowing_tenants if other != tenant)
        return found

    def _start_share(self, tenant: str) -> float:
        """The tenant's weighted share before this cycle's placements (the borrowing order's key)."""
        share = self.memo.start_shares.get(tenant)
        if share is None:
            quota = self.quota(tenant)
            share = self.memo.start_shares[tenant] = weighted_share(
                quota.decayed_usage, self.start_held.get(tenant, 0), quota.weight, self.config.usage_half_life_s)
        return share
