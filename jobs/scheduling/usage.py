"""Fair-share arithmetic: half-life decay of a tenant's GPU usage, and the weighted share that
orders borrowing across tenants.

The service keeps each tenant's ``decayed_usage`` (GPU-seconds) in Redis or the database and
advances it with ``decay_usage`` once per cycle; the core only reads it from ``TenantQuota``.
"""

from __future__ import annotations

import math


def decay_usage(previous: float, current_gpus: float, elapsed_s: float, half_life_s: float) -> float:
    """Advance a decayed usage total by ``elapsed_s`` during which ``current_gpus`` were held.

    Exact for constant use over the interval: the old total decays by 2^(-elapsed/half_life) and
    the new use is integrated under the same decay, so calling it every 2 s or every hour gives
    the same number. Holding g GPUs forever converges to g * half_life / ln 2 GPU-seconds.
    """
    if elapsed_s <= 0:
        return previous
    if half_life_s <= 0:
        return current_gpus * elapsed_s
    rate = math.log(2) / half_life_s
    keep = math.exp(-rate * elapsed_s)
    return previous * keep + current_gpus * (1.0 - keep) / rate


def steady_state_usage(gpus: float, half_life_s: float) -> float:
    """The decayed usage that holding ``gpus`` forever converges to (GPU-seconds)."""
    return gpus * half_life_s / math.log(2)


def weighted_share(decayed_usage: float, held_milli: int, weight: float, half_life_s: float) -> float:
    """Borrowing order key, lowest first: (recent usage + GPUs held now) / weight.

    GPUs held now are counted at their steady-state equivalent so the two terms share a unit and a
    placement made earlier in this cycle pushes its tenant back at once.
    """
    return (decayed_usage + steady_state_usage(held_milli / 1000, half_life_s)) / max(weight, 1e-9)
