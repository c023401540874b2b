"""A GPU backend for machines without GPUs: an inventory described by a spec string.

``8xA100-80GB`` is eight A100s with 80 GB each; ``4xV100-32GB,4xT4-16GB`` puts two groups on one
node with consecutive indices (0-3 V100, 4-7 T4). UUIDs are deterministic per node and index so
that a restarted simulated agent is the same node to the control plane.
"""

from __future__ import annotations

import re

from agents.protocol import GpuInfo

# Total memory in MiB as the driver reports it (nvidia-smi "memory.total"), which is a little
# below the marketing size for some boards; the scheduler packs against these numbers.
GPU_CATALOG: dict[str, int] = {
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "H100-80GB": 81559,
    "V100-32GB": 32768,
    "V100-16GB": 16384,
    "T4-16GB": 15360,
    "A10-24GB": 23028,
    "L4-24GB": 23034,
}

# NVML numbers at most 64 GPUs per node and GpuInfo.index enforces the same bound.
MAX_GPUS = 64

_GROUP_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")
_CATALOG_BY_UPPER = {model.upper(): model for model in GPU_CATALOG}


def parse_spec(spec: str) -> list[tuple[str, int]]:
    """``"2xT4-16GB,1xA10-24GB"`` -> ``[("T4-16GB", 15360), ("T4-16GB", 15360), ("A10-24GB", 23028)]``.

    Raises ``ValueError`` with a message fit for a command-line error.
    """
    if not spec or not spec.strip():
        raise ValueError("empty GPU spec; expected e.g. '8xA100-80GB' or '4xV100-32GB,4xT4-16GB'")
    gpus: list[tuple[str, int]] = []
    for group in spec.split(","):
        match = _GROUP_RE.match(group)
        if not match:
            raise ValueError(f"bad GPU group {group.strip()!r}; expected COUNTxMODEL, e.g. '8xA100-80GB'")
        count, name = int(match.group(1)), match.group(2)
        model = _CATALOG_BY_UPPER.get(name.upper())
        if model is None:
            raise ValueError(f"unknown GPU model {name!r}; known models: {', '.join(GPU_CATALOG)}")
        if count < 1:
            raise ValueError(f"GPU group {group.strip()!r} must have at least one GPU")
        gpus.extend([(model, GPU_CATALOG[model])] * count)
        if len(gpus) > MAX_GPUS:
            raise ValueError(f"spec {spec!r} describes more than {MAX_GPUS} GPUs")
    return gpus


class SimulatedBackend:
    """The GPUs a spec describes; nothing is probed."""

    name = "simulated"

    def __init__(self, spec: str, node: str):
        self.spec = spec
        self._gpus = [
            GpuInfo(index=index, uuid=f"GPU-sim-{node}-{index}", model=model, memory_mib=memory_mib)
            for index, (model, memory_mib) in enumerate(parse_spec(spec))
        ]

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def close(self) -> None:
        pass
