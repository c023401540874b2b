"""Benchmark: one change to the scheduler's settings against LAS, paired by Philly window and seed.

    .venv/bin/python -m bench.philly_probe                                     # the default config
    .venv/bin/python -m bench.philly_probe --set borrower_turnover_gpu_s=7200 --seeds 0,1,2
    .venv/bin/python -m bench.philly_probe --set duty_cycle_increase=0.2 --windows 2017-11-15

Each window and seed is replayed three times on the same trace, under ``fair_share`` with the
settings given (``--set NAME=VALUE``, any ``SchedulerConfig`` field), under
``least_attained_service`` and under ``least_attained_guaranteed`` (LAS bound by the guarantees
``fair_share`` keeps), in ``-j`` worker processes. Prints, per window and seed, the average JCT of
each and fair_share's ratio to LAS, p95, Jain's fairness over tenants, queueing and the guaranteed
jobs' slowdown, then the geometric mean of the ratios to LAS (the figure issue 34's goal is judged
by: at most 1) and to LAS keeping the guarantees. CPU seconds are every
process's (the workers' included). Asserts nothing. The five windows take about 50 CPU seconds a
seed here; LAS is replayed every time (nothing is cached between runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.scheduling.config import SchedulerConfig  # noqa: E402
from jobs.scheduling.policies import POLICIES  # noqa: E402
from jobs.scheduling.simulate import loaders  # noqa: E402
from jobs.scheduling.simulate.engine import DEFAULT_INTERFERENCE, replay  # noqa: E402
from jobs.scheduling.simulate.metrics import summarise  # noqa: E402

WINDOWS = ("2017-10-03", "2017-10-17", "2017-11-01", "2017-11-15", "2017-12-01")
HOUR = 3600.0


def settings(pairs: list[str]) -> dict:
    """``NAME=VALUE`` pairs as ``SchedulerConfig`` overrides, each value of its field's type."""
    fields = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
    out = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in fields or not text:
            raise ValueError(f"--set takes NAME=VALUE with NAME a SchedulerConfig field; got {pair!r}")
        kind = type(getattr(SchedulerConfig(), name))
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name} is true or false; got {text!r}")
            out[name] = text.lower() in ("true", "1")
        else:
            out[name] = kind(text)
    return out


def run_one(task: tuple) -> dict:
    policy, overrides, day, seed, interference = task
    trace = loaders.load_philly(nodes=16, since=day, first=1000, seed=seed)
    config = dataclasses.replace(SchedulerConfig(), **overrides)
    s = summarise(replay(trace, POLICIES[policy], config, name=policy, interference=interference))
    return {"avg": s["jct_s"]["mean"] / HOUR, "p95": s["jct_s"]["p95"] / HOUR, "jain": s["jain_fairness"],
            "queue": s["queueing_s"]["mean"] / HOUR, "guaranteed": s["guaranteed_slowdown"],
            "preemptions": s["preemptions"], "unfinished": s["unfinished"]}


def compare(overrides: dict, windows: list[str], seeds: list[int], interference: float, workers: int) -> list[tuple]:
    """(day, seed, fair_share's summary, LAS's summary), in window then seed order."""
    cells = [(day, seed) for day in windows for seed in seeds]
    policies = (("fair_share", overrides), ("least_attained_service", {}), ("least_attained_guaranteed", {}))
    tasks = [(policy, over, day, seed, interference) for day, seed in cells for policy, over in policies]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(run_one, tasks))
    else:
        results = list(map(run_one, tasks))
    n = len(policies)
    return [(day, seed, *results[n * i:n * i + n]) for i, (day, seed) in enumerate(cells)]


def report(rows: list[tuple]) -> tuple[list[str], float, float]:
    """The table's lines, and the geometric means of fair_share's average JCT over LAS's and over
    that of LAS keeping the guarantees."""
    lines = [f"{'window':12s}{'seed':>5s}{'avg JCT h':>12s}{'LAS':>7s}{'ratio':>8s}{'LAS-G':>7s}{'ratio':>8s}"
             f"{'p95 h':>8s}{'LAS':>7s}{'Jain':>8s}{'LAS':>7s}{'queue h':>9s}{'LAS':>7s}{'guar.':>8s}"]
    logs, kept = [], []
    for day, seed, mine, las, guarded in rows:
        ratio, ratio_kept = mine["avg"] / las["avg"], mine["avg"] / guarded["avg"]
        logs.append(math.log(ratio))
        kept.append(math.log(ratio_kept))
        slowdown = "-" if mine["guaranteed"] is None else f"+{mine['guaranteed'] * 100:.1f}%"
        lines.append(f"{day:12s}{seed:5d}{mine['avg']:12.2f}{las['avg']:7.2f}{ratio:8.3f}{guarded['avg']:7.2f}"
                     f"{ratio_kept:8.3f}{mine['p95']:8.1f}{las['p95']:7.1f}{mine['jain']:8.3f}{las['jain']:7.3f}"
                     f"{mine['queue']:9.2f}{las['queue']:7.2f}{slowdown:>8s}")
    return lines, math.exp(sum(logs) / len(logs)), math.exp(sum(kept) / len(kept))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a SchedulerConfig field for fair_share (repeat for several)")
    parser.add_argument("--windows", default="all", help=f"comma-separated first days, or 'all' ({', '.join(WINDOWS)})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (they redraw per-job usage)")
    parser.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE)
    parser.add_argument("-j", "--workers", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        overrides = settings(args.set)
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as error:
        parser.error(str(error))
    windows = list(WINDOWS) if args.windows == "all" else args.windows.split(",")
    wall, cpu = time.perf_counter(), time.process_time()
    rows = compare(overrides, windows, seeds, args.interference, args.workers)
    lines, geomean, geomean_kept = report(rows)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"fair_share {overrides or '(defaults)'} beside LAS, interference {args.interference}")
    print("\n".join(lines))
    print(f"geo-mean of avg JCT / LAS: {geomean:.4f}; / LAS keeping the guarantees (LAS-G): {geomean_kept:.4f}")
    print(f"bench: {time.perf_counter() - wall:.0f} s wall, "
          f"{time.process_time() - cpu + children.ru_utime + children.ru_stime:.0f} s CPU (all processes)")


if __name__ == "__main__":
    main()
