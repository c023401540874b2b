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


def charged_milli(gpu_milli: int, gpus_requested_milli, borrower: bool) -> int:
    """What one job counts against its tenant's ceiling (``max_gpus``) and fair share: its request
    on each GPU, except that a borrower on a GPU whose residents' requests over-commit it counts
    its share of the GPU (its request x 1000 / what all residents request there).

    Counting a shared borrower whole let a tenant reach its ceiling on GPUs it only shared: on the
    Philly 2017-10-17 window a 720-job tenant sat at its 128-GPU ceiling (the whole cluster) and
    its short jobs queued 513 h in all against 85 h under LAS; counted by share, fair_share's
    average JCT there went from 7.46 h to 6.80 h (seed 0). A guaranteed job counts whole: its
    neighbours yield to it (throttling), so it has the GPU it asked for.
    """
    if not borrower:
        return gpu_milli * len(gpus_requested_milli)
    return sum(gpu_milli if requested <= 1000 else gpu_milli * 1000 // requested for requested in gpus_requested_milli)
