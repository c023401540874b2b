"""Side-by-side comparison of policies on one trace: a table, a JSON file and a plotly HTML page.

Every figure is also given as a ratio to ``fifo_exclusive`` (exclusive whole GPUs, first come
first served), the baseline the papers report against. The HTML page embeds plotly.js (no CDN:
clusters are often offline) with the JCT CDF, utilisation over time and, when measured, the
fragmentation fill curve.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.simulate.engine import replay
from jobs.scheduling.simulate.metrics import fill_curve, fill_summary, summarise, utilisation_series
from jobs.scheduling.simulate.trace import Trace

BASELINE = "fifo_exclusive"

# Rows whose value rests on the synthetic per-job usage (utilisation, memory) where the trace has
# it, marked "*" in the table; rows marked "~" rest on the co-location model (interference).
SYNTHETIC = "*"
MODELLED = "~"

# (label, path in a summary, lower is better, format)
ROWS = (
    ("avg JCT (h) ~", ("jct_s", "mean"), True, "hours"),
    ("median JCT (h) ~", ("jct_s", "median"), True, "hours"),
    ("p95 JCT (h) ~", ("jct_s", "p95"), True, "hours"),
    ("avg queueing (h)", ("queueing_s", "mean"), True, "hours"),
    ("p95 queueing (h)", ("queueing_s", "p95"), True, "hours"),
    ("makespan (h) ~", ("makespan_s",), True, "hours"),
    ("phys. alloc (arrival win.)", ("window_gpu_physical_allocation",), False, "share"),
    ("phys. alloc (whole run)", ("gpu_physical_allocation",), False, "share"),
    ("GPU util (arrival win.) *", ("window_gpu_utilisation",), False, "share"),
    ("GPU util (whole run) *", ("gpu_utilisation",), False, "share"),
    ("GPUs busy (whole run)", ("gpu_allocation",), False, "share"),
    ("GPU mem util (arr. win.) *", ("window_gpu_memory_utilisation",), False, "share"),
    ("GPU mem util (whole run) *", ("gpu_memory_utilisation",), False, "share"),
    ("Jain fairness (tenants) ~", ("jain_fairness",), False, "share"),
    ("preemptions", ("preemptions",), True, "count"),
    ("throttles", ("throttles",), True, "count"),
    ("  of which suspensions", ("suspensions",), True, "count"),
    ("unfinished jobs", ("unfinished",), True, "count"),
    ("GPU memory overflows", ("memory_violations",), True, "count"),
    ("CPU overcommits", ("cpu_violations",), True, "count"),
    ("phys. alloc at 90% asked", ("fill", "allocated_at_90"), False, "share"),
    ("phys. alloc at 100% asked", ("fill", "allocated_at_100"), False, "share"),
)


def compare(trace: Trace, policies: dict, config: SchedulerConfig = SchedulerConfig(), *, fill: bool = False,
            timed: bool = True, interval: float = 2.0, restart_overhead_s: float = 30.0, progress=None,
            **engine_options) -> dict:
    """Replay every policy on the same trace (``timed``) and/or measure its fill curve (``fill``);
    returns the JSON-ready comparison."""
    timed = timed and trace.timed  # a pod list without timestamps has no JCT to give
    runs = {}
    for name, policy in policies.items():
        started = time.perf_counter()
        summary = {"policy": name, "jct_sorted_s": [], "utilisation_series": []}
        if timed:
            result = replay(trace, policy, config, name=name, interval=interval, restart_overhead_s=restart_overhead_s,
                            **engine_options)
            summary = summarise(result)
            summary["jct_sorted_s"] = sorted(r.jct for r in result.records.values() if r.jct is not None)
            summary["utilisation_series"] = utilisation_series(result)
        if fill:
            points = fill_curve(trace, policy, config)
            summary["fill"] = fill_summary(points)
            summary["fill_curve"] = [(p.arrived, p.allocated) for p in points]
        summary["replay_seconds"] = time.perf_counter() - started
        runs[name] = summary
        if progress:
            progress(name, summary)
    return {
        "trace": trace.name,
        "jobs": len(trace.jobs),
        "gpus": trace.total_gpus,
        "nodes": len(trace.nodes),
        "skipped": trace.skipped,
        "synthetic": list(trace.synthetic),
        "quotas": [{"tenant": q.name, "guaranteed_gpus": q.guaranteed_gpus, "max_gpus": q.max_gpus, "weight": q.weight}
                   for q in trace.quotas],
        "baseline": BASELINE if BASELINE in runs else next(iter(runs), None),
        "policies": runs,
    }


def _value(summary: dict, path: tuple[str, ...]):
    value = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _show(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "hours":
        return f"{value / 3600:.2f}"
    if kind == "share":
        return f"{value:.3f}"
    return f"{value:g}"


def ratios(comparison: dict) -> dict[str, dict[str, float | None]]:
    """Per policy, per row label: value / baseline value (None where undefined)."""
    runs, baseline = comparison["policies"], comparison["baseline"]
    out = {}
    for name, summary in runs.items():
        out[name] = {}
        for label, path, _, _ in ROWS:
            mine, base = _value(summary, path), _value(runs[baseline], path) if baseline else None
            out[name][label] = mine / base if mine is not None and base else None
    return out


def table(comparison: dict) -> str:
    runs = comparison["policies"]
    names = list(runs)
    ratio = ratios(comparison)
    width = max(14, *(len(n) + 2 for n in names))
    lines = [f"{comparison['trace']}: {comparison['jobs']} jobs on {comparison['gpus']} GPUs "
             f"({comparison['nodes']} nodes); ratios are to {comparison['baseline']}",
             f"{'':28s}" + "".join(f"{n:>{width}s}" for n in names)]
    for label, path, _, kind in ROWS:
        values = [_value(runs[n], path) for n in names]
        if all(v is None for v in values):
            continue
        cells = []
        for name, value in zip(names, values):
            r = ratio[name][label]
            text = _show(value, kind) + (f" x{r:.3g}" if r is not None and name != comparison["baseline"] else "")
            cells.append(f"{text:>{width}s}")
        lines.append(f"{label:28s}" + "".join(cells))
    lines.append(f"{SYNTHETIC} rests on synthetic {'; '.join(comparison.get('synthetic') or ['(none in this trace)'])}")
    lines.append(f"{MODELLED} rests on the engine's co-location model (over-subscription and interference)")
    return "\n".join(lines)


def write_json(comparison: dict, path: str | Path) -> None:
    document = {**comparison, "ratios_to_baseline": ratios(comparison)}
    Path(path).write_text(json.dumps(document, indent=1, default=float))


def write_html(comparison: dict, path: str | Path) -> None:
    import plotly.graph_objects as go  # only the report needs plotly
    import plotly.io as pio

    runs = comparison["policies"]
    cdf = go.Figure()
    for name, summary in runs.items():
        jcts = summary["jct_sorted_s"]
        n = len(jcts)
        cdf.add_trace(go.Scatter(x=[j / 3600 for j in jcts], y=[(i + 1) / n for i in range(n)],
                                 mode="lines", name=name))
    cdf.update_layout(title="Job completion time CDF", xaxis_title="JCT (hours, log)", xaxis_type="log",
                      yaxis_title="share of jobs")
    util = go.Figure()
    for name, summary in runs.items():
        series = summary["utilisation_series"]
        util.add_trace(go.Scatter(x=[p[0] for p in series], y=[p[1] for p in series], mode="lines", name=name))
    util.update_layout(title="GPU utilisation over time (busy SM share of the cluster)",
                       xaxis_title="hours since the first submission", yaxis_title="utilisation", yaxis_range=[0, 1])
    figures = [cdf, util]
    if any("fill_curve" in s for s in runs.values()):
        fill = go.Figure()
        for name, summary in runs.items():
            if "fill_curve" in summary:
                curve = summary["fill_curve"]
                fill.add_trace(go.Scatter(x=[p[0] for p in curve], y=[p[1] for p in curve], mode="lines", name=name))
        fill.add_trace(go.Scatter(x=[0, 1.3], y=[0, 1.3], mode="lines", name="ideal", line={"dash": "dot"}))
        fill.update_layout(title="Fragmentation: allocated vs requested GPU capacity as the cluster fills",
                           xaxis_title="requested (share of capacity)", yaxis_title="allocated (share of capacity)")
        figures.append(fill)
    parts = [pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False) for i, fig in enumerate(figures)]
    escaped = table(comparison).replace("&", "&amp;").replace("<", "&lt;")
    Path(path).write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Colony trace replay</title></head>"
        f"<body><h1>Trace replay: {comparison['trace']}</h1><pre>{escaped}</pre>{''.join(parts)}</body></html>"
    )
