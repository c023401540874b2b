"""Benchmark: full-size trace replays, every policy side by side (issue "Trace replay").

    .venv/bin/python -m bench.replay                      # both presets below
    .venv/bin/python -m bench.replay --preset philly --repeat 3

Presets (each fits in a few minutes on one core):

* ``philly``: 3,000 consecutive Philly jobs (from job 30,000, mid-October 2017) on 32 nodes x 8
  GPUs, guarantees proportional to each virtual cluster's demand. Per-job utilisation and memory
  are synthetic (Philly records neither; see ``loaders.USAGE_CLASSES``).
* ``alibaba``: the fragmentation experiment of Weng et al. (ATC'23): every GPU pod of the openb
  default list (and of the GPU-sharing-heavy gpushare40 list) that ran, arriving on the whole
  1,213-node, 6,212-GPU cluster and never leaving (the list is replayed again until 130% of
  the capacity was asked for); then 1,500 pods on the clock on an 8-node subset, where they
  contend.

Prints each comparison table (every figure also as a ratio to FIFO-exclusive) and the median
wall time of each policy's replay with its ratio to FIFO-exclusive's, measured in this process.
Writes JSON and HTML under ``var/bench-replay/<preset>/``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.scheduling.config import SchedulerConfig  # noqa: E402
from jobs.scheduling.policies import POLICIES  # noqa: E402
from jobs.scheduling.simulate import loaders, replay, report  # noqa: E402

# (label, trace, measure the fill curve, replay on the clock)
PRESETS = {
    "philly": [("philly-3000-jobs-256-gpus", lambda: loaders.load_philly(nodes=32, skip=30000, first=3000), False, True)],
    "alibaba": [
        # The paper's experiment: every pod that ran, arriving on the whole cluster, never leaving.
        ("alibaba-fill-whole-cluster", lambda: loaders.load_alibaba("default"), True, False),
        ("alibaba-gpushare40-fill-whole-cluster", lambda: loaders.load_alibaba("gpushare40"), True, False),
        # On the clock: the trace's pods arrive over months, so only a small subset of the nodes
        # makes them contend: the first 1,500 pods on 8 nodes (30 GPUs).
        ("alibaba-1500-pods-8-nodes", lambda: loaders.load_alibaba("default", nodes=8, first=1500), False, True),
    ],
}


def run(label: str, make_trace, fill: bool, timed: bool, repeat: int, out: Path) -> None:
    trace = make_trace()
    print(f"\n== {label}: {len(trace.jobs)} jobs, {trace.total_gpus} GPUs, {len(trace.nodes)} nodes; "
          f"left out: {trace.skipped or 'none'}", flush=True)
    comparison = report.compare(trace, POLICIES, SchedulerConfig(), fill=fill, timed=timed)
    print(report.table(comparison))
    # Wall time: the first run is in the comparison; repeat the replays alone for a median.
    times = {}
    for name, policy in POLICIES.items():
        samples = [comparison["policies"][name]["replay_seconds"]]
        for _ in range(repeat - 1 if timed else 0):
            started = time.perf_counter()
            replay(trace, policy, name=name)
            samples.append(time.perf_counter() - started)
        times[name] = statistics.median(samples)
    base = times["fifo_exclusive"]
    print(f"wall time per policy (median of {len(samples)}): "
          + ", ".join(f"{n} {t:.1f} s (x{t / base:.2f})" for n, t in times.items()))
    folder = out / label
    folder.mkdir(parents=True, exist_ok=True)
    report.write_json(comparison, folder / "replay.json")
    report.write_html(comparison, folder / "replay.html")
    print(f"wrote {folder}/replay.json and replay.html", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=[*PRESETS, "all"], default="all")
    parser.add_argument("--repeat", type=int, default=1, help="replays per policy for the median wall time")
    parser.add_argument("--out", type=Path, default=Path("var/bench-replay"))
    args = parser.parse_args()
    for name in PRESETS if args.preset == "all" else [args.preset]:
        for label, make_trace, fill, timed in PRESETS[name]:
            run(label, make_trace, fill, timed, args.repeat, args.out)


if __name__ == "__main__":
    main()
