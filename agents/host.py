"""What a node offers jobs besides GPUs: CPU cores and host memory, after what the agent keeps for
the system (the agent itself, the kernel, page cache, a shell for the operator).

Reported once, in the registration, as milli-cores and MiB; the scheduler then never places more
requested CPU or memory on the node than this (``jobs/scheduling/filters/host_resources.py``).
The cores counted are the ones this process may run on (its CPU affinity, which a container or a
cgroup cpuset narrows), not every core the machine has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agents import protocol

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class HostOffer:
    cpu_milli: int
    host_memory_mib: int


def machine_cpu_milli() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return cores * 1000


def machine_memory_mib(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def offer(cpus: float | None = None, memory_mib: int | None = None, reserve_cpus: float = 1.0,
          reserve_memory_mib: int = 4096) -> HostOffer | None:
    """``cpus``/``memory_mib``: what to offer, as the operator set it; else the machine's less the
    reserve (never below one core and 1 GiB, a node always runs something). None when the memory
    cannot be read (the node is then not counted on host resources)."""
    cpu_milli = round(cpus * 1000) if cpus is not None else max(1000, machine_cpu_milli() - round(reserve_cpus * 1000))
    if memory_mib is None:
        total = machine_memory_mib(MEMINFO)
        if total is None:
            return None
        memory_mib = max(1024, total - reserve_memory_mib)
    return HostOffer(min(cpu_milli, protocol.CPU_MILLI_MAX), min(memory_mib, protocol.HOST_MEMORY_MIB_MAX))
