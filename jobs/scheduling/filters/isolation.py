"""Filter: how a device fences co-located jobs from each other (``agents.isolation``).

* A MIG instance is fenced in hardware from the rest of its GPU, not from a second job inside it:
  it takes one job at a time, and only a job that asked for exactly its profile. A job that asked
  for a profile runs on nothing else (a whole GPU is not a "1g.10gb").
* On an ``unfenced`` GPU nothing stops one job allocating past its share, so a job joins residents
  there only if it and every resident accept that (the memory-pressure preemption is then the
  only guard). ``mps`` and ``memory_limit`` GPUs enforce each job's share and take anyone.
"""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import NamedFilter


def admits_pool(pool, shape) -> bool:
    return pool.mig_profile == (shape.mig_profile or "")


def admits_shared_gpu(gpu, shape, job_class=None, config=None) -> bool:
    if gpu.isolation == "unfenced":
        return shape.accepts_unfenced and gpu.unfenced_refusals == 0
    return gpu.isolation != "mig"


def never(check, shape):
    if shape.mig_profile is None:
        if not check.online_models and check.online_mig_profiles:
            return reasons.only_mig_instances(check.online_mig_profiles)
        return None
    if shape.gpus != 1:
        return reasons.invalid_request("a MIG instance is one device; a job asking for a MIG profile takes gpus=1")
    if shape.mig_profile not in check.online_mig_profiles:
        return reasons.no_mig_profile(shape.mig_profile, check.online_mig_profiles)
    return None


FILTER = NamedFilter("isolation", admits_pool=admits_pool, admits_shared_gpu=admits_shared_gpu, never=never)
