"""What a job that cannot start now is told, and the gang hold it may take (``WaitExplainer``).

It reads the cycle's fixed inputs (capacity, placer, quotas, clock), its ``state`` (what each
tenant holds, the hold) and its ``memo`` (under ``Memo``'s rule), all handed to it. The reasons
for a tenant at its ceiling, for a job that found no GPUs (held nodes, host CPU or memory short,
guaranteed but full, spare capacity gone to lower-usage tenants, over quota and cluster full), the
ETA attached to each, and the one bounded reservation per cycle (rules in ``reservation``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from jobs.scheduling import reasons
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import Reservation
from jobs.scheduling.eta import QueueEta, ReleaseTimeline
from jobs.scheduling.filters import host_resources
from jobs.scheduling.outcomes import JobOutcomes
from jobs.scheduling.placement import Shape
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.reservation import may_backfill, nodes_to_hold, window
from jobs.scheduling.snapshot import JobClass, JobRequest, TenantQuota
from jobs.scheduling.usage import weighted_share

GUARANTEED = JobClass.GUARANTEED
# A borrower waits behind tenants with lower usage or usage this much above its tenant's at most
# (level with it: they take turns), where one of them borrows.
LEVEL_USAGE_MARGIN = 0.05


class WaitExplainer:
    """``releases``: the running jobs' expected ends (``eta.releases_of``); ``start_held`` and
    ``borrowing_at_start``: what each tenant held, and which tenants borrowed, before the cycle."""

    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo, outcomes: JobOutcomes,
                 queue_eta: QueueEta, releases: list, start_held: dict[str, int], borrowing_at_start: frozenset[str]):
        self.inputs, self.now, self.config = inputs, inputs.now, inputs.config
        self.capacity, self.placer, self.carry = inputs.capacity, inputs.placer, inputs.carry
        self.state, self.memo, self.outcomes, self.queue_eta = state, memo, outcomes, queue_eta
        self.releases, self.start_held, self.borrowing_at_start = releases, start_held, borrowing_at_start

    # -- a tenant at its ceiling ---------------------------------------------------------------------

    def ceiling_waits(self, tenant: str) -> dict[int, tuple[PendingReason, float | None]]:
        """What a job of ``tenant`` asking N milli-GPUs past its ceiling is told, at what it holds now."""
        return self.memo.ceiling_waits.setdefault((tenant, self.state.held[tenant]), {})

    def ceiling_wait(self, quota: TenantQuota, need: int) -> tuple[PendingReason, float | None]:
        name, ceiling = quota.name, quota.ceiling_milli
        held = self.state.held[name]
        eta = self._tenant_timeline(name).eta(held + need - ceiling)
        found = self.ceiling_waits(name)[need] = (self.memo.reason(reasons.at_max_gpus, name, ceiling, need), eta)
        return found

    def _tenant_timeline(self, tenant: str) -> ReleaseTimeline:
        memo = self.memo
        if not memo.timelines:
            # The cycle's releases (all tenants' in time order), each tenant's apart, less the
            # jobs told to stop by now.
            by_tenant: dict[str, list] = defaultdict(list)
            leaving = self.state.leaving
            for release in self.releases:
                if release[3] not in leaving:
                    by_tenant[release[2]].append(release)
            memo.timelines = {t: ReleaseTimeline((), self.now, found) for t, found in by_tenant.items()}
        if tenant not in memo.timelines:
            memo.timelines[tenant] = ReleaseTimeline([], self.now)
        return memo.timelines[tenant]

    # -- a job that found no GPUs --------------------------------------------------------------------

    def blocked(self, job: JobRequest, shape: Shape, job_class: JobClass) -> PendingReason:
        """A job that fits the inventory and its quota found no GPUs: say why, maybe reserve."""
        state, reason_of = self.state, self.memo.reason
        if state.holder is None and job.gpus > 1 and (held := self._hold(job, shape)) is not None:
            return held
        if state.holder is not None and self._fits_reserved(shape, job_class):
            holder, nodes, _ = state.holder
            reason = reason_of(reasons.reserved_for_gang, holder.id, holder.gpus, nodes)
        elif shape.needs_host and (short := self._host_shortage(shape, job_class)) is not None:
            needed = (shape.cpu_per_gpu if short == "cpu" else shape.host_mb_per_gpu) * job.gpus
            reason = reason_of(reasons.insufficient_host, short, job.gpus, needed)
        elif job_class is GUARANTEED:
            pools = self.placer.pools_for(shape)
            most_free = self.capacity.most_free_on_a_node(pools)
            if state.holder is not None and may_backfill(job, state.holder[2]):
                # (a node held for a gang is out of the indexes, but this job may backfill it)
                for by_model in self.placer.pools_by_model(pools):
                    for node in state.reserved_nodes:
                        most_free = max(most_free, sum(1 for g in node.empty if g.pool in by_model))
            reason = reason_of(reasons.waiting_for_free_gpus, job.gpus, shape.memory_mib, shape.max_nodes == 1,
                               most_free)
        elif (job.opportunistic_only
              and state.held[job.tenant] + job.quota_milli <= self.inputs.quota(job.tenant).guaranteed_milli):
            reason = reason_of(reasons.no_spare_capacity, job.gpus)
        elif self._lower_usage_borrowing(job.tenant):
            reason = reason_of(reasons.behind_lower_usage, job.tenant)
        else:
            quota = self.inputs.quota(job.tenant)
            unused = quota.guaranteed_milli - state.guaranteed_held[job.tenant]
            reason = reason_of(reasons.over_quota_cluster_full, job.tenant, quota.guaranteed_milli, unused, job.gpus)
        self.outcomes.wait(job, reason, self.queue_eta.next(job.quota_milli))
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
        state = self.state
        state.reserved_nodes = nodes
        state.holder = (job, names, eta)
        state.version += 1
        state.reservations.append(Reservation(job.id, names, since=span[0], until=span[1], eta_s=eta))
        reason = reasons.holding_reservation(job.gpus, names, span[1], self.now)
        self.outcomes.wait(job, reason, None if eta is None else self.now + eta)
        return reason

    def _fits_reserved(self, shape: Shape, job_class: JobClass) -> bool:
        """Would the job fit on the held nodes? (then the hold is what keeps it waiting)"""
        memo = self.memo
        if memo.not_on_reserved.fails(job_class, shape):
            return False
        key = (job_class, shape)
        fits = memo.fits_reserved.get(key)
        if fits is None:
            fits = memo.fits_reserved[key] = self.placer.fits_on(self.state.reserved_nodes, shape, job_class)
            if not fits:
                memo.not_on_reserved.record(job_class, shape)
        return fits

    def _lower_usage_borrowing(self, tenant: str) -> bool:
        """Does another tenant with lower or about the same weighted usage at the start of the cycle
        (at most LEVEL_USAGE_MARGIN above ``tenant``'s) hold borrowed GPUs: opportunistic jobs still
        running, or placed this cycle? A fact about the cluster, not about this cycle's few
        placements, so the verdict it gives stays put from one cycle to the next while the cluster
        does. (Tenants level in usage take turns borrowing, each placement pushing its tenant back:
        by the exact order, the lowest two of them swapped the verdicts of every one of their
        waiting jobs each cycle, 1,300-1,600 jobs each at 200,000 pending.)"""
        key = (tenant, len(self.state.borrowing_tenants))  # (borrowers only join within a cycle)
        found = self.memo.lower_borrowing.get(key)
        if found is None:
            level = self._start_share(tenant) * (1 + LEVEL_USAGE_MARGIN)
            found = self.memo.lower_borrowing[key] = any(
                self._start_share(other) <= level
                for other in self.borrowing_at_start | self.state.borrowing_tenants if other != tenant)
        return found

    def _start_share(self, tenant: str) -> float:
        """The tenant's weighted share before this cycle's placements (the borrowing order's key)."""
        share = self.memo.start_shares.get(tenant)
        if share is None:
            quota = self.inputs.quota(tenant)
            share = self.memo.start_shares[tenant] = weighted_share(
                quota.decayed_usage, self.start_held.get(tenant, 0), quota.weight, self.config.usage_half_life_s)
        return share
