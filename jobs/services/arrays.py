"""Job array specs, as Slurm writes them: ``"0-99"``, ``"1,3,5-7"``, ``"0-99%8"`` (at most 8 of
the array running at once), ``"0-98:2"`` (every second index)."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_INDEX = 1_000_000
_RANGE = re.compile(r"^(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?$")


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]
    max_running: int | None


def parse(spec: str, max_size: int) -> ArraySpec:
    """Raises ValueError with a message a researcher can act on."""
    text = spec.strip()
    ranges, _, limit = text.partition("%")
    max_running = None
    if limit:
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError(f"'%{limit}' must be a whole number of jobs of at least 1, as in 0-99%8.")
        max_running = int(limit)
    indices: set[int] = set()
    for part in filter(None, (p.strip() for p in ranges.split(","))):
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"'{part}' is not an index or a range; write e.g. 0-99, 1,3,5-7 or 0-98:2.")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        step = int(match.group(3)) if match.group(3) else 1
        if last < first or step < 1:
            raise ValueError(f"'{part}' is an empty range.")
        if last > MAX_INDEX:
            raise ValueError(f"Indices go up to {MAX_INDEX}.")
        if (last - first) // step + 1 + len(indices) > max_size:
            raise ValueError(f"An array may have at most {max_size} jobs.")
        indices.update(range(first, last + 1, step))
    if not indices:
        raise ValueError("Give the indices, e.g. 0-99 or 0-99%8.")
    if len(indices) > max_size:
        raise ValueError(f"An array may have at most {max_size} jobs.")
    return ArraySpec(indices=tuple(sorted(indices)), max_running=max_running)
