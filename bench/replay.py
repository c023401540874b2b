"""Benchmark: scheduling quality on the public traces, Colony beside named baselines, over seeds.

    .venv/bin/python -m bench.replay                          # both presets, quick: 1 seed, ~4 min CPU
    .venv/bin/python -m bench.replay --preset fgd --seeds 10 --pods default,gpushare40,multigpu50
    .venv/bin/python -m bench.replay --preset philly --seeds 3 --windows all
    .venv/bin/python -m bench.replay --preset philly --interference 0.2,0.5   # beside what a GPU measured

Presets:

* ``fgd``: FGD's protocol (Weng et al., ATC'23) on the Alibaba openb node list (1,213 nodes,
  6,212 GPUs): every pod of the list (CPU-only and never-scheduled ones included), shuffled per
  seed and resampled until 130% of the GPU capacity has arrived, nothing leaving. Colony's
  policies beside Random, BestFit, GPU packing and FGD (placing by request, CPU and host memory
  enforced) and exclusive FIFO, with FGD's published figures beside. Physical allocation (each
  GPU capped at 1000 milli), fragmentation F(M), nodes over their CPU.
* ``philly``: 1,000-job Philly windows (Oct-Dec 2017) on 16 x 8 GPUs, each with its offered
  load; every policy at interference 0 and at the default; guarantees split evenly over
  Philly's 15 virtual clusters (a rule that never looks at the window). Per-job utilisation and
  memory are synthetic (Philly records neither): the seed redraws them.

Prints the tables (median [min-max] over seeds), the CPU seconds of each policy's runs, and the
wall and CPU time of the whole bench. Writes JSON under ``var/bench-replay/``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.scheduling.policies import POLICIES  # noqa: E402
from jobs.scheduling.simulate import loaders, protocol  # noqa: E402
from jobs.scheduling.simulate.engine import DEFAULT_INTERFERENCE  # noqa: E402

FILL_POLICIES = ("fair_share", "packing_without_quotas", "random_fit", "best_fit", "gpu_packing", "fgd",
                 "fifo_exclusive")
WINDOW_POLICIES = ("fair_share", "packing_without_quotas", "fifo_exclusive", "least_attained_service",
                   "least_attained_guaranteed")
# (first submission, label); 1,000 jobs each. Offered load is printed with each.
PHILLY_WINDOWS = {
    "2017-10-03": "early Oct", "2017-10-17": "mid Oct (the busiest day)", "2017-11-01": "Nov 1",
    "2017-11-15": "mid Nov", "2017-12-01": "Dec 1",
}
# fair_share at interference 0.2 costs the most (AIMD readjusts every cycle): ~40 CPU s per seed
# here, ~110 for 2017-12-01, ~200 for 2017-10-17.
QUICK_WINDOWS = ("2017-11-01",)


def fgd_preset(pod_lists: list[str], seeds: list[int], out: Path) -> None:
    nodes = loaders.load_alibaba_nodes()
    policies = {name: POLICIES[name] for name in FILL_POLICIES}
    for pods_name in pod_lists:
        pods = loaders.alibaba_pods(pods_name)
        print(f"\n== FGD protocol, {pods_name}: {len(pods)} pods ({sum(1 for p in pods if not p.gpus)} CPU-only)",
              flush=True)
        document = protocol.fill_protocol(
            pods_name, pods, nodes, policies, seeds,
            progress=lambda name, run: print(f"  {name}: {run['cpu_s']:.1f} CPU s", flush=True))
        print(protocol.fill_table(document), flush=True)
        (out / f"fgd-{pods_name}.json").write_text(json.dumps(document, indent=1, default=float))


def philly_preset(windows: list[str], seeds: list[int], out: Path,
                  interferences: tuple[float, ...] = (0.0, DEFAULT_INTERFERENCE)) -> None:
    policies = {name: POLICIES[name] for name in WINDOW_POLICIES}
    made = [(f"Philly from {day} ({PHILLY_WINDOWS.get(day, '')})",
             lambda seed, day=day: loaders.load_philly(nodes=16, since=day, first=1000, seed=seed))
            for day in windows]
    document = protocol.windows(
        made, policies, seeds, interferences,
        progress=lambda label, i, name, row: print(f"  {label} i={i}: {name} {row['cpu_s']:.1f} CPU s", flush=True))
    print(protocol.windows_table(document), flush=True)
    (out / "philly-windows.json").write_text(json.dumps(document, indent=1, default=float))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=["fgd", "philly", "all"], default="all")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per comparison (FGD's protocol uses 10)")
    parser.add_argument("--pods", default="default",
                        help="fgd: comma-separated pod lists (default, gpushare40, multigpu50)")
    parser.add_argument("--windows", default=",".join(QUICK_WINDOWS),
                        help=f"philly: comma-separated first days, or 'all' ({', '.join(PHILLY_WINDOWS)})")
    parser.add_argument("--interference", default=f"0,{DEFAULT_INTERFERENCE}",
                        help="philly: comma-separated interference coefficients (a co-resident slows its "
                             "neighbours by this x its duty cycle; measured on an H100 for two compute-bound "
                             "jobs: 0.3-0.4 under MPS, 0.52-0.55 time-sliced)")
    parser.add_argument("--out", type=Path, default=Path("var/bench-replay"))
    args = parser.parse_args()
    try:
        interferences = tuple(float(x) for x in args.interference.split(","))
    except ValueError:
        parser.error(f"--interference takes numbers separated by commas, e.g. 0,0.2,0.5; got {args.interference!r}")
    if not interferences or not all(0 <= x <= 1 for x in interferences):
        parser.error("each --interference must be in [0, 1]")
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    wall, cpu = time.perf_counter(), time.process_time()
    if args.preset in ("fgd", "all"):
        fgd_preset(args.pods.split(","), seeds, args.out)
    if args.preset in ("philly", "all"):
        windows = list(PHILLY_WINDOWS) if args.windows == "all" else args.windows.split(",")
        philly_preset(windows, seeds, args.out, interferences)
    print(f"\nbench: {time.perf_counter() - wall:.0f} s wall, {time.process_time() - cpu:.0f} s CPU (one process)")


if __name__ == "__main__":
    main()
