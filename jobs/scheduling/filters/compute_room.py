"""Filter: opportunistic work joins a GPU with residents only while their load leaves room for its
demand (or at least ``min_shared_room_milli``: it runs on what is spare, throttled if a guaranteed
neighbour suffers). Guaranteed work is judged by ``exclusivity`` instead."""

from __future__ import annotations

from jobs.scheduling.filters.protocol import NamedFilter
from jobs.scheduling.snapshot import JobClass


def room_needed(shape, min_shared_room_milli: int) -> int:
    return min(shape.demand_milli, min_shared_room_milli)


def admits_shared_gpu(gpu, shape, job_class, config) -> bool:
    if job_class is not JobClass.OPPORTUNISTIC:
        return True
    return config.max_shared_load_milli - gpu.load_milli >= room_needed(shape, config.min_shared_room_milli)


FILTER = NamedFilter("compute_room", admits_shared_gpu=admits_shared_gpu)
