"""``python -m jobs.scheduling.simulate``: replay a trace under several policies, side by side.

    python -m jobs.scheduling.simulate --trace philly --nodes 16 --first 500
    python -m jobs.scheduling.simulate --trace alibaba --nodes 120 --first 1500
    python -m jobs.scheduling.simulate --trace var/last-week.json --quota-file proposed.json
    python -m jobs.scheduling.simulate --trace philly --nodes 16 --since 2017-12-01 --first 1000 --interference 0.2
    python -m jobs.scheduling.simulate --protocol fgd --pods gpushare40 --seeds 10

Prints a table (each figure also as a ratio to fifo_exclusive) and writes ``replay.json`` and
``replay.html`` under ``--out``; ``--protocol fgd`` runs FGD's fill protocol over ``--seeds``
seeds instead and writes ``fgd.json``. Exit status 2 on bad arguments or an unreadable trace.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import json

from jobs.scheduling.config import SchedulerConfig
from jobs.scheduling.policies import POLICIES
from jobs.scheduling.simulate import loaders, protocol, report
from jobs.scheduling.simulate.engine import DEFAULT_INTERFERENCE, Knowledge
from jobs.scheduling.simulate.trace import TraceFormatError, read_colony_trace, read_quota_file

GIB = 1024


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.scheduling.simulate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="philly",
                   help="philly, alibaba, or the path of a Colony JSON trace (manage.py export_trace)")
    p.add_argument("--traces-dir", type=Path, default=None,
                   help="folder of the public traces (default ../shared/traces)")
    p.add_argument("--pods", default="default", help="alibaba pod list: default, gpushare40, multigpu50 or a CSV path")
    p.add_argument("--nodes", type=int, default=None,
                   help="philly: nodes in the cluster (default 64); alibaba: evenly spaced subset of the node list")
    p.add_argument("--gpus-per-node", type=int, default=8, help="philly only")
    p.add_argument("--gpu-model", default="V100-32GB", help="philly only")
    p.add_argument("--gpu-memory-gib", type=int, default=32, help="philly only")
    p.add_argument("--tenants", type=int, default=4, help="alibaba: synthetic teams the pods are spread over")
    p.add_argument("--since", default=None, help="philly: first day replayed, e.g. 2017-12-01")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N jobs")
    p.add_argument("--first", type=int, default=None, help="replay only the first N jobs (after --skip)")
    p.add_argument("--hours", type=float, default=None, help="replay only jobs submitted in the first H hours")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic per-job utilisation and memory")
    p.add_argument("--usage", choices=["synthetic", "request"], default="synthetic",
                   help="alibaba: whole-GPU pods' use drawn (synthetic) or taken as their request")
    p.add_argument("--quotas", choices=["equal", "demand"], default="equal",
                   help="equal split over the trace's tenants (default), or proportional to the slice's own demand")
    p.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE,
                   help=f"speed a job loses per co-resident at full duty cycle (default {DEFAULT_INTERFERENCE})")
    p.add_argument("--memory-error", type=float, default=0.0,
                   help="sigma of the log-normal error on the memory the scheduler is told (0: exact)")
    p.add_argument("--usage-noise", type=float, default=0.0, help="sigma of the log-normal error on live utilisation")
    p.add_argument("--usage-delay", type=float, default=0.0, help="seconds the live utilisation lags behind")
    p.add_argument("--protocol", choices=["replay", "fgd"], default="replay",
                   help="fgd: FGD's fill protocol on an alibaba pod list (all pods, shuffled, to 130%%)")
    p.add_argument("--seeds", type=int, default=10, help="fgd protocol: seeds (median and range)")
    p.add_argument("--quota-file", type=Path, default=None,
                   help='JSON {"tenants": {"nlp": {"guaranteed_gpus": 8, "max_gpus": 16, "weight": 1}}}; '
                        "default: guarantees proportional to each tenant's demand")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of: {', '.join(POLICIES)}")
    p.add_argument("--interval", type=float, default=2.0, help="scheduling cycle period in seconds (production: 2)")
    p.add_argument("--restart-overhead", type=float, default=30.0,
                   help="seconds of work a preempted job redoes when it restarts")
    p.add_argument("--fill", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure fragmentation as the cluster fills (default: on for alibaba)")
    p.add_argument("--out", type=Path, default=Path("var/replay"), help="folder for replay.json and replay.html")
    return p


def load_trace(args) -> "loaders.Trace":
    if args.traces_dir is not None:
        loaders.TRACES_DIR = args.traces_dir
    if args.trace == "philly":
        trace = loaders.load_philly(nodes=args.nodes or 64, gpus_per_node=args.gpus_per_node, gpu_model=args.gpu_model,
                                    gpu_memory_mib=args.gpu_memory_gib * GIB, since=args.since, skip=args.skip,
                                    first=args.first, hours=args.hours, seed=args.seed, quotas=args.quotas,
                                    memory_error=args.memory_error)
    elif args.trace == "alibaba":
        trace = loaders.load_alibaba(args.pods, nodes=args.nodes, tenants=args.tenants, skip=args.skip,
                                     first=args.first, hours=args.hours, seed=args.seed, usage=args.usage,
                                     quotas=args.quotas, memory_error=args.memory_error)
    else:
        trace = read_colony_trace(args.trace)
    if args.quota_file is not None:
        trace = trace.with_quotas(read_quota_file(args.quota_file, trace))
    return trace


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    unknown = [name for name in args.policies.split(",") if name not in POLICIES]
    if unknown:
        print(f"unknown policy: {', '.join(unknown)} (choose from {', '.join(POLICIES)})", file=sys.stderr)
        return 2
    if args.traces_dir is not None:
        loaders.TRACES_DIR = args.traces_dir
    if args.protocol == "fgd":
        return fgd_protocol(args)
    try:
        trace = load_trace(args)
    except (OSError, TraceFormatError) as exc:
        print(f"cannot read the trace: {exc}", file=sys.stderr)
        return 2
    if not trace.jobs:
        print("the trace slice holds no job to replay", file=sys.stderr)
        return 2
    policies = {name: POLICIES[name] for name in args.policies.split(",")}
    fill = args.fill if args.fill is not None else args.trace == "alibaba"
    skipped = ", ".join(f"{count} {why}" for why, count in trace.skipped.items()) or "none"
    print(f"replaying {len(trace.jobs)} jobs of {trace.name} on {trace.total_gpus} GPUs "
          f"({len(trace.nodes)} nodes, {len(trace.tenants)} tenants); left out: {skipped}", flush=True)

    def progress(name: str, summary: dict) -> None:
        print(f"  {name}: {summary['replay_seconds']:.1f} s, {summary.get('cycles', 0)} cycles", flush=True)

    knowledge = Knowledge(usage_noise=args.usage_noise, usage_delay_s=args.usage_delay, seed=args.seed)
    comparison = report.compare(trace, policies, SchedulerConfig(), fill=fill, interval=args.interval,
                                restart_overhead_s=args.restart_overhead, progress=progress,
                                interference=args.interference, knowledge=knowledge)
    if not trace.timed:
        print("this pod list has no timestamps: no JCT, queueing or utilisation over time can be read from it")
    print(report.table(comparison))
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(comparison, args.out / "replay.json")
    report.write_html(comparison, args.out / "replay.html")
    print(f"wrote {args.out / 'replay.json'} and {args.out / 'replay.html'}")
    return 0


def fgd_protocol(args) -> int:
    try:
        pods = loaders.alibaba_pods(args.pods, tenants=args.tenants, usage=args.usage)
        nodes = loaders.load_alibaba_nodes(nodes=args.nodes)
    except OSError as exc:
        print(f"cannot read the trace: {exc}", file=sys.stderr)
        return 2
    policies = {name: POLICIES[name] for name in args.policies.split(",")}
    document = protocol.fill_protocol(
        str(args.pods), pods, nodes, policies, list(range(args.seeds)),
        progress=lambda name, run: print(f"  {name}: {run['cpu_s']:.1f} CPU s", flush=True))
    print(protocol.fill_table(document))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fgd.json").write_text(json.dumps(document, indent=1, default=float))
    print(f"wrote {args.out / 'fgd.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
