"""Comparison policy: the full core's packing, topology and throttling, with quotas switched off.

Every tenant gets no guarantee and no ceiling, so all new work is opportunistic: it shares GPUs
by memory and compute, is ordered across tenants by fair share only, and nothing is reclaimed for
a guarantee (borrowers still turn over: the least served first, ``turnover``).
The trace replay uses it to separate what packing buys from what quotas cost.
"""

from __future__ import annotations

from dataclasses import replace

from jobs.scheduling.carry import UNLIMITED_GPUS, Carry
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.cycle import decide
from jobs.scheduling.decisions import Decisions
from jobs.scheduling.snapshot import ClusterSnapshot, TenantQuota


def packing_without_quotas(snapshot: ClusterSnapshot, now: float, config: SchedulerConfig = SchedulerConfig(),
                           carry: Carry | None = None) -> Decisions:
    tenants = {job.tenant for job in snapshot.pending} | {job.tenant for job in snapshot.running}
    weights = {t.name: t for t in snapshot.tenants}
    unlimited = tuple(
        TenantQuota(name, guaranteed_gpus=0, max_gpus=UNLIMITED_GPUS,
                    weight=weights[name].weight if name in weights else 1.0,
                    decayed_usage=weights[name].decayed_usage if name in weights else 0.0)
        for name in sorted(tenants)
    )
    # Running jobs keep their class: in the trace replay everything this policy launched is
    # opportunistic anyway, and on a production snapshot guaranteed work stays protected.
    return decide(replace(snapshot, tenants=unlimited), now, config, carry)
