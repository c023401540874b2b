"""Simulated GPUs: the spec language and the inventory it yields."""

from __future__ import annotations

import pytest

from agents.backends.base import GpuBackend
from agents.backends.simulated import GPU_CATALOG, SimulatedBackend, parse_spec


def test_single_group_spec_gives_that_many_gpus():
    gpus = SimulatedBackend("8xA100-80GB", "n1").inventory()
    assert [gpu.index for gpu in gpus] == list(range(8))
    assert {gpu.model for gpu in gpus} == {"A100-80GB"}
    assert {gpu.memory_mib for gpu in gpus} == {81920}


def test_mixed_groups_get_consecutive_indices():
    gpus = SimulatedBackend("4xV100-32GB,4xT4-16GB", "n1").inventory()
    assert [(gpu.index, gpu.model) for gpu in gpus] == [(i, "V100-32GB") for i in range(4)] + [
        (i, "T4-16GB") for i in range(4, 8)
    ]
    assert gpus[4].memory_mib == 15360


def test_uuids_are_deterministic_and_unique_per_node():
    first = SimulatedBackend("2xH100-80GB", "gpu-01").inventory()
    again = SimulatedBackend("2xH100-80GB", "gpu-01").inventory()
    other = SimulatedBackend("2xH100-80GB", "gpu-02").inventory()
    assert [g.uuid for g in first] == [g.uuid for g in again] == ["GPU-sim-gpu-01-0", "GPU-sim-gpu-01-1"]
    assert not {g.uuid for g in first} & {g.uuid for g in other}


def test_longest_node_name_still_gives_valid_uuids():
    node = "n" * 63
    gpus = SimulatedBackend("64xL4-24GB", node).inventory()
    assert len(gpus) == 64 and all(len(gpu.uuid) <= 128 for gpu in gpus)


def test_spec_is_forgiving_about_case_and_spaces():
    assert parse_spec(" 2 x a10-24gb , 1X l4-24GB ") == [("A10-24GB", 23028)] * 2 + [("L4-24GB", 23034)]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty GPU spec"),
        ("8xB200-192GB", "unknown GPU model 'B200-192GB'; known models: A100-80GB"),
        ("A100-80GB", "expected COUNTxMODEL"),
        ("0xT4-16GB", "at least one GPU"),
        ("8xA100-80GB,", "bad GPU group"),
        ("65xT4-16GB", "more than 64 GPUs"),
    ],
)
def test_bad_spec_is_refused_with_a_helpful_message(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SimulatedBackend(spec, "n1")


def test_simulated_backend_satisfies_the_backend_protocol():
    backend = SimulatedBackend("1xT4-16GB", "n1")
    assert isinstance(backend, GpuBackend)
    assert backend.name == "simulated"
    backend.close()
    assert set(GPU_CATALOG) >= {"A100-80GB", "H100-80GB", "T4-16GB"}
