"""Filter: the GPU models a request allows (none named: any model)."""

from __future__ import annotations

from jobs.scheduling import reasons
from jobs.scheduling.filters.protocol import NamedFilter


def admits_pool(pool, shape) -> bool:
    return not shape.models or pool.model in shape.models


def never(check, shape):
    online = check.online_mig_models if shape.mig_profile else check.online_models
    if shape.models and not shape.models.intersection(online):
        return reasons.model_unavailable(shape.models, online)
    return None


FILTER = NamedFilter("gpu_model", admits_pool=admits_pool, never=never)
