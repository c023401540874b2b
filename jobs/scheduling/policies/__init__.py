"""Scheduling policies with one signature, ``policy(snapshot, now, config) -> Decisions``, so the
trace-replay simulator can run them side by side on the same snapshots.

``fair_share`` is the production policy (``jobs.scheduling.decide``); the others are baselines:
``fifo_exclusive`` and ``least_attained_service`` (Tiresias) for job completion time, the latter
also bound by tenants' guarantees (``least_attained_guaranteed``), and FGD's
GPU-sharing baselines by their names (``random_fit``, ``best_fit``, ``gpu_packing``, ``fgd``) for
packing. ``packing_without_quotas`` is Colony's own core with quotas switched off, not a baseline.
"""

from jobs.scheduling import decide as fair_share
from jobs.scheduling.policies.binpack import best_fit, fgd, gpu_packing, random_fit
from jobs.scheduling.policies.fifo_exclusive import fifo_exclusive
from jobs.scheduling.policies.least_attained import least_attained_guaranteed, least_attained_service
from jobs.scheduling.policies.packing import packing_without_quotas

POLICIES = {
    "fair_share": fair_share,
    "fifo_exclusive": fifo_exclusive,
    "packing_without_quotas": packing_without_quotas,
    "least_attained_service": least_attained_service,
    "least_attained_guaranteed": least_attained_guaranteed,
    "random_fit": random_fit,
    "best_fit": best_fit,
    "gpu_packing": gpu_packing,
    "fgd": fgd,
}
# Colony's policies, as opposed to the baselines it is compared with.
COLONY = ("fair_share", "packing_without_quotas")
# The policies that place by request (packing baselines): the fill protocol's comparison set.
PACKING_BASELINES = ("random_fit", "best_fit", "gpu_packing", "fgd")

__all__ = ["COLONY", "PACKING_BASELINES", "POLICIES", "best_fit", "fair_share", "fgd", "fifo_exclusive",
           "gpu_packing", "least_attained_guaranteed", "least_attained_service", "packing_without_quotas", "random_fit"]
