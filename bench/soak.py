"""Soak of the real stack under load (issue 35): jobs completed twice, run twice, lost and stuck
through fault rounds (SIGKILL of an agent, the worker, the ingest reader and Redis; XTRIM of the
command and event streams) and pause rounds (two agents SIGSTOPped, then SIGCONTed), with one CPU
hog per core.

    .venv/bin/python bench/soak.py [--jobs 80] [--fault-rounds 2] [--pause-rounds 1] [--pause-s 60] [--seed 35]
                                   [--grace-s 0]

Runs ``tests/e2e/test_soak.py``'s soak (the same stack, ledger and counts as ``make test``'s
shorter run) at this size, with PostgreSQL when one answers on 127.0.0.1:5432 (a database of its
own, dropped at the end) and SQLite otherwise, and prints the counts, the faults with the
completions each came at, wall and CPU time. The seed fixes the jobs' lengths, the fault order
and which agents are hit; the processes' timing is the machine's. Exits non-zero when a count
that must be 0 is not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _postgres_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), 1).close()
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument("--fault-rounds", type=int, default=2)
    parser.add_argument("--pause-rounds", type=int, default=1)
    parser.add_argument("--pause-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--grace-s", type=float, default=0.0,
                        help="the stack's node-loss grace (default 0: the pause + 30 s, so a pause is no loss)")
    parser.add_argument("--stall-s", type=float, default=240.0,
                        help="give up once no job has completed for this long (default 240)")
    args = parser.parse_args()

    kept = Path(tempfile.mkdtemp(prefix="colony-soak-"))  # the report, and the stack's logs and ledger
    report = kept / "report.json"
    env = {**os.environ, "SOAK_JOBS": str(args.jobs), "SOAK_FAULT_ROUNDS": str(args.fault_rounds),
           "SOAK_PAUSE_ROUNDS": str(args.pause_rounds), "SOAK_PAUSE_S": str(args.pause_s),
           "SOAK_SEED": str(args.seed), "SOAK_GRACE_S": str(args.grace_s), "SOAK_STALL_S": str(args.stall_s),
           "SOAK_REPORT": str(report)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not env.get("DATABASE_URL") and _postgres_answers():
        # pytest-django creates test_<name> and drops it after the run: two benches never share one.
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/colony_soak_{os.getpid()}"
    database = "PostgreSQL" if env.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    print(f"soak: {args.jobs} jobs, {args.fault_rounds} fault rounds, {args.pause_rounds} pause rounds of "
          f"{args.pause_s:g}s, seed {args.seed}, node-loss grace {args.grace_s or args.pause_s + 30:g}s, "
          f"{len(os.sched_getaffinity(0))} CPU hogs, {database}", flush=True)
    wall0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/e2e/test_soak.py", "-m", "e2e", "-q", "-s",
                             "-p", "no:randomly", "-p", "no:cacheprovider", f"--basetemp={kept / 'run'}"],
                            cwd=ROOT, env=env)
    wall = time.monotonic() - wall0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not report.exists():
        print(f"soak: no report (pytest exited {result.returncode} before the counts)")
        return result.returncode or 1
    figures = json.loads(report.read_text())
    counts = figures["counts"]
    print(f"\nsoak: jobs {counts['jobs']}, runs started {counts['runs_started']}, completed {counts['runs_completed']}")
    for name, words in (("completed_twice", "completed twice"), ("run_twice", "run twice"),
                        ("overlapped", "two runs at once"), ("lost", "lost"), ("stuck", "stuck"),
                        ("retried_after_loss", "retried, earlier run unfinished (preempted, stopped, killed)"),
                        ("rerun_after_declared_loss", "re-run after a declared node loss"),
                        ("completed_again_after_declared_loss", "  of which completed again")):
        print(f"soak:   {words:<62} {len(counts[name]):>4}  {counts[name][:20] or ''}")
    print(f"soak: flock violations {len(figures['flock_violations'])}, requeues {figures['requeues']}, "
          f"stale reports ignored {figures['stale_reports_ignored']}")
    for fault, at in figures["faults"]:
        print(f"soak:   fault at {at:>3} completions: {fault}")
    cpu = figures["cpu_s"]
    print(f"soak: wall {wall:.0f}s (the soak itself {figures['wall_s']:.0f}s); CPU: stack {cpu['stack']:.0f}s, "
          f"test process {cpu['test_process']:.0f}s, hogs {cpu['hogs']:.0f}s; all of pytest's tree "
          f"{children.ru_utime + children.ru_stime:.0f}s; load average at the end {figures['load_average']}")
    print(f"soak: reproduce with: {figures['command']}")
    print(f"soak: logs and ledger kept under {kept}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
