"""Print what the NVML backend sees on this machine, as JSON: for checking a real GPU node by hand.

    python -m agents.nvml_probe                      # inventory, topology, one sample
    python -m agents.nvml_probe --job-pid 4242       # ... with pid 4242's tree attributed to job 1
    python -m agents.nvml_probe --job-pid 4242 --job-pid 4343 --wait 2

Each ``--job-pid`` becomes job 1, 2, ... as if the agent had launched that process: its memory
(and that of every process in its session, group or descendants) lands in ``sample.jobs``;
everything else on the GPU in ``sample.unattributed_mib``. ``--wait`` takes a first sample, waits
and reports the second, so per-process utilisation covers a full window.

Exit status 0 on success, 1 when NVML is not usable here. Never imports Django.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time

from agents.backends.base import BackendUnavailable, JobProcesses
from agents.backends.nvml import NvmlBackend


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agents.nvml_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--job-pid", type=int, action="append", default=[], metavar="PID",
                        help="treat PID (and its process tree) as a job; repeatable")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="take a first sample, wait, and report the second (default: report the first)")
    return parser


def probe(job_pids: list[int], wait: float = 0.0, backend: NvmlBackend | None = None) -> dict:
    """Inventory, topology and one sample of ``backend`` (a new NvmlBackend by default)."""
    backend = backend or NvmlBackend("probe")
    try:
        inventory = backend.inventory()
        topology = backend.topology()
        jobs = {number: JobProcesses(job_id=number, pid=pid) for number, pid in enumerate(job_pids, start=1)}
        if wait > 0:
            backend.sample(jobs)
            time.sleep(wait)
        started = time.time()
        sample = backend.sample(jobs)
        return {
            "inventory": [gpu.model_dump() for gpu in inventory],
            "topology": [link.model_dump() for link in topology],
            "jobs": {str(number): pid for number, pid in enumerate(job_pids, start=1)},
            "sample": {
                "ts": started,
                "gpus": [gpu.model_dump() for gpu in sample.gpus],
                "jobs": [job.model_dump() for job in sample.jobs],
                "unattributed_mib": sample.unattributed_mib,
                "out_of_memory": [dataclasses.asdict(oom) for oom in sample.out_of_memory],
            },
        }
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = probe(args.job_pid, args.wait)
    except BackendUnavailable as exc:
        print(f"NVML unavailable: {exc}", file=sys.stderr)
        return 1
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
