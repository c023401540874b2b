"""Comparisons over several seeds, reported as median [min-max]: FGD's fill protocol on the
Alibaba pod lists, and timed replays of trace windows at several interference levels.

A seed changes what is random in a run: the fill protocol's shuffle and resampling, a timed
replay's synthetic per-job usage (and the knowledge error, when set). Every figure is printed
with its range, so a win inside the spread reads as one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.simulate import fill, published
from jobs.scheduling.simulate.engine import replay
from jobs.scheduling.simulate.metrics import summarise
from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob, offered_load

FILL_FIGURES = ("physical", "requested", "fragmentation", "frag_of_unallocated", "cpu_over_nodes")


def _cpu() -> float:
    return time.process_time()


def fill_protocol(name: str, pods: list[TraceJob], nodes: tuple[NodeSpec, ...], policies: dict, seeds: list[int],
                  *, step: float = 0.01, config: SchedulerConfig = SchedulerConfig(), progress=None) -> dict:
    """Every policy on the same seeded arrival orders; per level, per figure: median and range."""
    runs = {}
    for policy_name, policy in policies.items():
        started = _cpu()
        per_seed = [fill.summary(fill.run(pods, nodes, policy, seed=seed, step=step, config=config)) for seed in seeds]
        levels = {}
        for level in per_seed[0]:
            levels[level] = {figure: fill.spread([s[level][figure] for s in per_seed if level in s])
                             for figure in FILL_FIGURES}
        runs[policy_name] = {"levels": levels, "per_seed": per_seed, "cpu_s": _cpu() - started}
        if progress:
            progress(policy_name, runs[policy_name])
    return {"pods": name, "nodes": len(nodes), "gpus": sum(n.gpus for n in nodes), "seeds": list(seeds),
            "published_at_100": dict(zip(("best_fit", "fgd"), fill.PUBLISHED_AT_100.get(name, ()))),
            # FGD's own runs are on the whole node list: a subset is not comparable to them.
            "published": published.published(name, fill.LEVELS, gpus=sum(n.gpus for n in nodes)),
            "policies": runs}



def _cell(spread: dict, scale: float = 100.0, digits: int = 1) -> str:
    if spread is None or spread.get("median") is None:
        return "-"
    median, low, high = (spread[k] * scale for k in ("median", "min", "max"))
    if spread["n"] == 1 or abs(high - low) < 10 ** -digits / 2:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def fill_table(document: dict) -> str:
    runs = document["policies"]
    lines = [f"FGD fill protocol, pod list {document['pods']}: {document['nodes']} nodes, {document['gpus']} GPUs, "
             f"{len(document['seeds'])} seed(s) {document['seeds']}; median [min-max] over seeds, % of GPU capacity",
             f"{'policy':24s}{'phys@80':>18s}{'phys@90':>18s}{'phys@100':>18s}{'phys@130':>18s}"
             f"{'req.@130':>18s}{'frag@100':>18s}{'frag/unalloc@100':>20s}{'CPU>cap nodes@100':>20s}"]
    for name, run in runs.items():
        levels = run["levels"]
        get = lambda level, figure: levels.get(level, {}).get(figure)  # noqa: E731
        lines.append(f"{name:24s}" + "".join(f"{_cell(get(lv, 'physical')):>18s}" for lv in ("80", "90", "100", "130"))
                     + f"{_cell(get('130', 'requested')):>18s}{_cell(get('100', 'fragmentation')):>18s}"
                     f"{_cell(get('100', 'frag_of_unallocated')):>20s}{_cell(get('100', 'cpu_over_nodes'), 1, 0):>20s}")
    at_100 = document.get("published_at_100") or {}
    if at_100:
        lines.append(f"{'published (FGD paper)':24s}{'':36s}"
                     + f"{'BestFit ' + format(at_100['best_fit'] * 100, '.1f'):>18s}"
                     + f"   FGD {at_100['fgd'] * 100:.1f} (10-seed means at 100% arrived, CPU enforced)")
    theirs = document.get("published") or {}
    mine = [name for name in runs if name in theirs]
    if mine:
        lines.append("beside FGD's published runs (its simulator, 10 seeds): ours | theirs median [min-max], "
                     "'in' when our median lies inside their spread")
        lines.append(f"{'policy':24s}" + "".join(f"{'@' + lv:>36s}" for lv in ("80", "90", "100", "130")))
        for name in mine:
            cells = []
            for lv in ("80", "90", "100", "130"):
                ours = runs[name]["levels"].get(lv, {}).get("physical")
                spread = theirs[name].get(lv)
                flag = published.inside(ours.get("median") if ours else None, spread)
                mark = {True: "in", False: "OUT", None: "-"}[flag]
                cells.append(f"  {_cell(ours) + ' | ' + _cell(spread) + ' ' + mark:>34s}")
            lines.append(f"{name:24s}" + "".join(cells))
    lines.append("phys = requests placed, each GPU capped at 1000 milli (FGD's allocation ratio); req. = uncapped; "
                 "frag = FGD's F(M) over GPU capacity. No figure here rests on synthetic usage except Colony's "
                 "(fair_share, packing_without_quotas: their sharing reads the live utilisation)")
    return "\n".join(lines)


# -- timed replays of windows ------------------------------------------------------------------------

WINDOW_FIGURES = (
    ("avg JCT (h)", ("jct_s", "mean"), 1 / 3600),
    ("p95 JCT (h)", ("jct_s", "p95"), 1 / 3600),
    ("avg queue (h)", ("queueing_s", "mean"), 1 / 3600),
    ("phys.alloc win", ("window_gpu_physical_allocation",), 1.0),
    ("phys.alloc all", ("gpu_physical_allocation",), 1.0),
    ("Jain", ("jain_fairness",), 1.0),
    ("guar. slowdown", ("guaranteed_slowdown",), 1.0),
    ("unfinished", ("unfinished",), 1.0),
    ("mem overflows", ("memory_violations",), 1.0),
)


def _path(summary: dict, path: tuple[str, ...]):
    value = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def windows(windows_: list[tuple[str, Callable[[int], Trace]]], policies: dict, seeds: list[int],
            interferences: tuple[float, ...], *, config: SchedulerConfig = SchedulerConfig(), progress=None,
            **engine_options) -> dict:
    """``windows_``: (label, seed -> trace). Each policy, seed and interference level replayed."""
    out = []
    for label, make in windows_:
        traces = {seed: make(seed) for seed in seeds}
        first = traces[seeds[0]]
        entry = {"window": label, "jobs": len(first.jobs), "gpus": first.total_gpus,
                 "offered_load": offered_load(first), "synthetic": list(first.synthetic), "levels": {}}
        for interference in interferences:
            level = {}
            for name, policy in policies.items():
                started = _cpu()
                summaries = [summarise(replay(traces[seed], policy, config, name=name, interference=interference,
                                              **engine_options)) for seed in seeds]
                level[name] = {label_: fill.spread([_path(s, path) for s in summaries])
                               for label_, path, _ in WINDOW_FIGURES}
                level[name]["cpu_s"] = _cpu() - started
                if progress:
                    progress(label, interference, name, level[name])
            entry["levels"][str(interference)] = level
        out.append(entry)
    return {"seeds": list(seeds), "interferences": list(interferences), "windows": out}


def windows_table(document: dict, baseline: str = "fifo_exclusive") -> str:
    lines = []
    for entry in document["windows"]:
        load = entry["offered_load"]
        lines.append(f"\n{entry['window']}: {entry['jobs']} jobs on {entry['gpus']} GPUs, offered load "
                     f"{'-' if load is None else format(load, '.2f')}x capacity; {len(document['seeds'])} seed(s); "
                     "median [min-max]")
        for interference, level in entry["levels"].items():
            lines.append(f"  interference {float(interference):.2f} per co-resident")
            lines.append(f"  {'policy':26s}" + "".join(f"{label:>22s}" for label, _, _ in WINDOW_FIGURES)
                         + f"{'avg JCT / ' + baseline:>28s}")
            base = level.get(baseline, {}).get("avg JCT (h)", {}).get("median")
            for name, figures in level.items():
                cells = []
                for label, _, scale in WINDOW_FIGURES:
                    spread = figures[label]
                    digits = 0 if label in ("unfinished", "mem overflows") else (2 if scale != 1.0 else 3)
                    cells.append(f"{_cell(spread, scale, digits):>22s}")
                mine = figures["avg JCT (h)"]["median"]
                ratio = f"x{mine / base:.3f}" if base and mine is not None else "-"
                lines.append(f"  {name:26s}" + "".join(cells) + f"{ratio:>28s}")
        if entry["synthetic"]:
            synthetic = "; ".join(entry["synthetic"])
            lines.append(f"  JCT, queueing and fairness of sharing policies rest on synthetic {synthetic}"
                         " and on the interference level; exclusive policies' do not")
    return "\n".join(lines)
