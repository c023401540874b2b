"""How far the ETAs the scheduler gave turned out to be off, so researchers know how much to trust one.

Each waiting job keeps the first start time it was promised (``JobWait.first_eta_at``, written
with its verdict) and, at its first placement, how far off that was (``Job.eta_error_s``:
placement minus promise, so late is positive). This summarises those errors over the jobs a user may see.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from datetime import datetime


@dataclass(frozen=True)
class EtaAccuracy:
    jobs: int  # jobs that were given an ETA and have started since
    median_error_s: float | None  # signed: + means they started later than predicted
    median_abs_error_s: float | None
    p90_abs_error_s: float | None  # 9 in 10 started within this of their ETA
    late_share: float | None  # of those jobs, the share that started more than a minute late

    def as_dict(self) -> dict:
        return asdict(self)


LATE_S = 60.0


def eta_accuracy(jobs, since: datetime) -> EtaAccuracy:
    """``jobs``: a queryset already scoped to what the reader may see."""
    errors = list(jobs.filter(eta_error_s__isnull=False, submitted_at__gte=since).values_list("eta_error_s", flat=True))
    if not errors:
        return EtaAccuracy(0, None, None, None, None)
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, max(0, -(-9 * len(absolute) // 10) - 1))]  # nearest rank
    return EtaAccuracy(
        jobs=len(errors),
        median_error_s=statistics.median(errors),
        median_abs_error_s=statistics.median(absolute),
        p90_abs_error_s=p90,
        late_share=sum(e > LATE_S for e in errors) / len(errors),
    )
