"""The filter registry: every constraint is one named ``Filter`` the placer, the explainer and the
reclaimer all ask, and an impossible request is told which constraint no node meets."""

from __future__ import annotations

import pytest

from jobs.scheduling import filters
from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.cycle import Cycle
from jobs.scheduling.filters.protocol import NEUTRAL
from jobs.scheduling.placement import shape_of
from tests.scheduling.builders import cluster, job, node, tenant

HOOKS = tuple(NEUTRAL)


def test_every_registered_filter_is_a_named_filter_with_callable_hooks():
    assert [f.name for f in filters.FILTERS] == list(filters.BY_NAME)  # unique names, registry order
    for registered in filters.FILTERS:
        assert isinstance(registered.name, str) and all(callable(getattr(registered, h)) for h in HOOKS)
        # (cordon has no hook: cordoned nodes are in no index; it words the wait, cordon.explain)
        assert any(registered.offers(hook) for hook in HOOKS) or registered.name == "cordon", registered.name


def _unschedulable(request, *nodes):
    snapshot = cluster(*nodes, pending=[request], tenants=[tenant("vision", guaranteed=8)])
    cycle = Cycle(snapshot, 100.0, SchedulerConfig())
    try:
        return filters.unschedulable(cycle.inputs.inventory, shape_of(request, SchedulerConfig()))
    finally:
        cycle.inputs.capacity.dismantle()


@pytest.mark.parametrize(("request_", "failing", "code"), [
    (job(1, models=("H100-80GB",)), "gpu_model", "gpu_model_unavailable"),
    (job(2, mem_gib=200), "gpu_memory", None),
    (job(3, gpus=16, max_nodes=1), "gang_width", None),
    (job(4, image=True), "container_runtime", None),
], ids=["model", "memory", "gang", "runtime"])
def test_an_impossible_request_is_told_which_filter_no_node_passes(request_, failing, code):
    status = _unschedulable(request_, node("a"), node("b"))

    assert not status.ok and status.filter == failing
    assert status.reason is not None and status.reason.message
    if code:
        assert status.reason.code.value == code


def test_a_request_some_node_can_take_passes_every_filter():
    assert _unschedulable(job(5, gpus=8, mem_gib=40), node("a"), node("b")).ok
