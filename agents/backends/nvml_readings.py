"""NVML's raw readings made into wire values: numbers checked for range, counts in units, MIG
profile names, PCI bus keys. Pure (no NVML calls, no logging): :mod:`agents.backends.nvml` asks
the library and passes its answers through these.
"""

from __future__ import annotations

import math
import re

from agents import protocol

BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)")
MIG_PROFILE = re.compile(protocol.MIG_PROFILE_RE)


def text(value) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def number(value, low: float = float("-inf"), high: float = float("inf")) -> float | None:
    """A finite reading within ``[low, high]``, else ``None``: a broken sensor's 0xFFFFFFFF is
    "unknown", not a value the wire schema would refuse along with the node's whole sample."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None


def percent(value) -> float | None:
    reading = number(value)
    return None if reading is None else min(100.0, max(0.0, reading))


def count(value, unit: int = 1, high: int = protocol.COUNTER_MAX) -> int | None:
    """A non-negative integer reading in ``unit``s up to ``high``, or ``None`` (missing, NVML's
    "not available", out of range)."""
    reading = number(value)
    if reading is None or reading < 0 or reading >= 2**63:
        return None
    units = int(reading) // unit
    return units if units <= high else None


def profile_name(name) -> str | None:
    """``b"MIG 1g.10gb"`` (the v2 profile info's name) -> ``"1g.10gb"``; ``None`` if it is not
    one our wire schema takes (a newer spelling), so the caller builds one instead."""
    if not name:
        return None
    spelled = text(name).strip().lower()
    spelled = spelled[len("mig "):] if spelled.startswith("mig ") else spelled
    return spelled if MIG_PROFILE.match(spelled) else None


def built_profile(slices: int | None, memory_mib) -> str | None:
    """``<slices>g.<GB>gb`` from a profile's slice count and memorySizeMB (MiB): NVML's names
    round the memory up to whole GiB on A100 and H100 (9.5 GiB is ``1g.10gb``, 79.25 ``7g.80gb``).
    Larger boards name theirs in other ways (H200's ``1g.18gb``), which is why the name wins."""
    memory = count(memory_mib)
    if not slices or not memory:
        return None
    return f"{slices}g.{math.ceil(memory / 1024)}gb"


def bus_key(pci) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI info struct; busId spellings differ in domain width."""
    if pci is None:
        return None
    for field in ("busId", "busIdLegacy"):
        spelled = getattr(pci, field, None)
        match = BUS_ID.search(text(spelled)) if spelled else None
        if match:
            return int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16)
    try:
        return int(pci.domain), int(pci.bus), int(pci.device)
    except (AttributeError, TypeError, ValueError):
        return None
