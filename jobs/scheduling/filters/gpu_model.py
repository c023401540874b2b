"""Filter: the GPU models a request allows (none named: any model)."""

from __future__ import annotations

from jobs.scheduling import reasons


def admits_pool(pool, shape) -> bool:
    return not shape.models or pool[0] in shape.models


def never(check, shape):
    if shape.models and not shape.models.intersection(check.online_models):
        return reasons.model_unavailable(shape.models, check.online_models)
    return None
