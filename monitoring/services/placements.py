"""Which jobs a node may report on: the jobs placed on it.

A node's key speaks only for that node, and a node may report GPU memory and utilisation only
for jobs the control plane placed there and that still hold GPUs there (or released them moments
ago: a job's last samples may arrive just after it ended); anything else (a bug, or a node lying to poison another
tenant's profile) is dropped before it reaches the rollups. Placements live in the ``jobs`` app,
which ``monitoring`` must not import, so ``jobs`` installs the lookup when it loads
(:meth:`jobs.apps.JobsConfig.ready`). Without one (monitoring used alone) every report counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# (node, job_id) pairs to check -> the subset where the job holds GPUs on that node now, or released
# them within a short grace; never a node that held the job's GPUs long ago.
PlacementLookup = Callable[[set[tuple[str, int]]], set[tuple[str, int]]]

_lookup: PlacementLookup | None = None


def install(lookup: PlacementLookup) -> None:
    global _lookup
    _lookup = lookup


def placed(pairs: Iterable[tuple[str, int]]) -> set[tuple[str, int]] | None:
    """The pairs whose job is (or was moments ago) placed on that node; None when no lookup is installed."""
    pairs = set(pairs)
    if _lookup is None or not pairs:
        return None if _lookup is None else set()
    return _lookup(pairs)
