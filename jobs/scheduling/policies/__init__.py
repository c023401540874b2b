"""Scheduling policies with one signature, ``policy(snapshot, now, config) -> Decisions``, so the
trace-replay simulator can run them side by side on the same snapshots.

``fair_share`` is the production policy (``jobs.scheduling.decide``); the others are baselines.
"""

from jobs.scheduling.cycle import decide as fair_share
from jobs.scheduling.policies.fifo_exclusive import fifo_exclusive
from jobs.scheduling.policies.least_attained import least_attained_service
from jobs.scheduling.policies.packing import packing_without_quotas

POLICIES = {
    "fair_share": fair_share,
    "fifo_exclusive": fifo_exclusive,
    "packing_without_quotas": packing_without_quotas,
    "least_attained_service": least_attained_service,
}

__all__ = ["POLICIES", "fair_share", "fifo_exclusive", "least_attained_service", "packing_without_quotas"]
