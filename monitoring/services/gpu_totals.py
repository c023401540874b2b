"""Physical GPUs and MIG instances, counted apart, for every page and series that shows a total.

An agent registers each MIG instance as a device of its own (a ``Gpu`` row with isolation
``mig``, its profile and ``parent_index``, the board it is carved from) and no row for the board
itself: the scheduler places jobs on devices. Counting rows therefore counts a 7-way split A100
as seven GPUs (``colony_gpus`` said 19 on a 16-A100 cluster). A total of GPUs here is of boards:
a whole GPU's row is one, and the instances of one board (node, ``parent_index``) are one
together; the instances are counted beside it, by profile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from monitoring.models import Gpu


@dataclass(frozen=True)
class GpuTotals:
    gpus: int = 0  # physical GPUs, a MIG-split board once
    mig_gpus: int = 0  # of those, split into MIG instances
    mig_instances: int = 0
    by_model: tuple[tuple[str, int], ...] = ()  # physical GPUs per model, by model name
    mig_by_profile: tuple[tuple[str, str, int], ...] = field(default=())  # (model, profile, instances)

    @property
    def label(self) -> str:
        """``16 GPUs (4 split into 12 MIG instances)``, or ``16 GPUs`` without MIG."""
        text = f"{self.gpus} GPU{'' if self.gpus == 1 else 's'}"
        if self.mig_gpus:
            text += (f" ({self.mig_gpus} split into {self.mig_instances} MIG "
                     f"instance{'' if self.mig_instances == 1 else 's'})")
        return text

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "mig_gpus": self.mig_gpus, "mig_instances": self.mig_instances,
                "label": self.label}


#: The ``Gpu`` fields :func:`count_devices` reads, in order.
DEVICE_FIELDS = ("node_id", "model", "mig_profile", "parent_index")


def totals_of(devices: Iterable[Gpu]) -> GpuTotals:
    """The totals of these device rows (``Gpu`` objects; pass present ones)."""
    return count_devices((gpu.node_id, gpu.model, gpu.mig_profile, gpu.parent_index) for gpu in devices)


def present_totals() -> GpuTotals:
    """The totals of every present device of the cluster, in one query."""
    return count_devices(Gpu.objects.filter(present=True).order_by().values_list(*DEVICE_FIELDS).iterator())


def count_devices(devices: Iterable[tuple]) -> GpuTotals:
    """The totals of devices given as (node id, model, MIG profile, parent index, ...) each: what
    another app counts of its own selection (``jobs``: the devices its jobs hold)."""
    whole: Counter[str] = Counter()
    boards: dict[tuple[int, int], str] = {}  # (node, parent_index) -> model
    instances: Counter[tuple[str, str]] = Counter()
    for node_id, model, profile, parent, *_ in devices:
        if profile is None:
            whole[model] += 1
        else:
            boards[node_id, parent] = model
            instances[model, profile] += 1
    by_model = whole + Counter(boards.values())
    return GpuTotals(
        gpus=sum(by_model.values()), mig_gpus=len(boards), mig_instances=sum(instances.values()),
        by_model=tuple(sorted(by_model.items())),
        mig_by_profile=tuple(sorted((model, profile, n) for (model, profile), n in instances.items())),
    )
