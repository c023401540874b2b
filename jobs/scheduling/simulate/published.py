"""FGD's published fill-protocol results (``../shared/traces/fgd-published/``): the GPU allocation
ratio its own simulator reached, per pod list, policy and seed (10 seeds, 42-51), at each arrived
percentage 0..130 (``analysis_allo_discrete.csv``, from the artifact's expected results).

``published(pods)`` gives, for each of Colony's baseline names, the published median and 10-seed
range at the protocol's levels, so a replay's figure reads beside it and ``inside`` says whether it
lies within the spread. Pure file reading: no Django.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from jobs.scheduling.simulate import loaders

PUBLISHED_CSV = "fgd-published/analysis_allo_discrete.csv"
# Colony's baseline -> FGD's policy folder in the artifact.
POLICY_NAMES = {"random_fit": "01-Random", "gpu_packing": "04-GpuPacking", "best_fit": "05-BestFit", "fgd": "06-FGD"}


def published(pods: str, levels: tuple[float, ...], *, gpus: int | None = None, path: str | Path | None = None) -> dict:
    """{baseline: {"80": {"median", "min", "max", "n"}, ...}} for pod list ``pods`` (a name such as
    ``default``, or a path whose stem is ``openb_pod_list_<name>``); {} when the CSV or the list
    is not there, or when ``gpus`` is not the published runs' cluster size (a subset of the node
    list is not comparable). Values are shares of GPU capacity (0..1)."""
    path = Path(path) if path else loaders.TRACES_DIR / PUBLISHED_CSV
    name = Path(str(pods)).stem
    workload = name if name.startswith("openb_pod_list_") else f"openb_pod_list_{name}"
    try:
        with open(path, newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if row["workload"] == workload
                    and (gpus is None or int(float(row["total_gpus"])) == gpus)]
    except OSError:
        return {}
    out = {}
    for colony, fgd_name in POLICY_NAMES.items():
        mine = [row for row in rows if row["sc_policy"] == fgd_name]
        if not mine:
            continue
        out[colony] = {}
        for level in levels:
            key = str(round(level * 100))
            values = [float(row[key]) / 100 for row in mine if row.get(key)]
            if values:
                out[colony][key] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                                    "n": len(values)}
    return out


def inside(value: float | None, spread: dict | None, slack: float = 0.0) -> bool | None:
    """Whether ``value`` lies in the published [min, max] (widened by ``slack`` either side)."""
    if value is None or not spread:
        return None
    return spread["min"] - slack - 1e-9 <= value <= spread["max"] + slack + 1e-9
