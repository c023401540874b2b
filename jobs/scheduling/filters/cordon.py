"""Filter: an operator's cordon keeps new work off a node (it stays out of every index). When
only cordoned nodes could run a request, its owner is told the cordon is what keeps it waiting."""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import NamedFilter

# No hook: a cordoned node is out of every index, so no placement sees it. What the filter adds
# is ``explain``, which the inventory check asks once every other filter has answered.
FILTER = NamedFilter("cordon")


def explain(check, shape, reason):
    """``reason``: why ``shape`` fits none of the schedulable nodes. Name the cordoned nodes when
    they would fit it."""
    if reason is None or not check.cordoned or reason.code is reasons.ReasonCode.NO_NODES_ONLINE:
        return reason  # (with no node schedulable, that reason already counts the cordoned ones)
    if check.with_cordoned()._reason(shape) is not None:
        return reason
    # Name only the cordoned nodes with GPUs this request can use (model, memory).
    pools = set(check.pools(shape))
    able = sorted(n.name for n in check.cordoned if any(g.pool in pools for g in n.gpus))
    return reasons.needs_cordoned_nodes(able, reason)
