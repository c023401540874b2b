"""The deterministic simulation of the control plane and its agents (tests/simulation), over many seeds.

    PYTHONHASHSEED=0 .venv/bin/python bench/simulate_protocol.py --seeds 1000 --start 0
    PYTHONHASHSEED=0 .venv/bin/python bench/simulate_protocol.py --seed 17      # one seed, its whole trace

Each seed runs the real lifecycle, node health, fan-in, ingest and scheduling loop and the real
agent command handling on a simulated clock, with seeded network and process faults, and checks
the invariants of tests/simulation/invariants.py after every event. Prints the seeds run, the
invariant violations, and for each failing seed the one command that reproduces it. A throw-away
SQLite database and fakeredis: no server is needed. Agent authentication is off (see world.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup() -> None:
    """Django on a fresh SQLite database of its own (the tests' settings), migrated."""
    workdir = Path(tempfile.mkdtemp(prefix="colony-simulate-"))
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'simulate.sqlite3'}"
    os.environ["REDIS_URL"] = "redis://simulated/0"
    os.environ["COLONY_VAR_DIR"] = str(workdir)
    os.environ.pop("COLONY_AGENT_SECRET", None)
    if not (os.environ.get("DJANGO_SECRET_KEY") or os.environ.get("DJANGO_SECRET_KEY_FILE")):
        key = workdir / "django-secret-key"
        key.write_text(secrets.token_urlsafe(50))
        key.chmod(0o600)
        os.environ["DJANGO_SECRET_KEY_FILE"] = str(key)
    os.environ["DJANGO_SETTINGS_MODULE"] = "cluster_ui.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def command_for(seed: int) -> str:
    return f"PYTHONHASHSEED=0 .venv/bin/python bench/simulate_protocol.py --seed {seed}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this seed alone and print its whole trace")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("note: PYTHONHASHSEED is not 0; a seed replays exactly only with the same hash seed", file=sys.stderr)
    setup()
    logging.disable(logging.CRITICAL if args.seed is None else logging.WARNING)
    from tests.simulation.world import run_seed

    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    failing: dict[int, list[str]] = {}
    cpu, wall = time.process_time(), time.perf_counter()
    for seed in seeds:
        outcome = run_seed(seed, verbose=args.seed is not None)
        if not outcome.ok:
            failing[seed] = outcome.violations
            if args.seed is None:
                print(f"seed {seed}: {outcome.violations[0]}", flush=True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    violations = sum(len(v) for v in failing.values())
    print(f"seeds run: {len(seeds)} ({seeds[0]}..{seeds[-1]}); invariant violations: {violations} "
          f"in {len(failing)} seed(s); {cpu:.1f} CPU s, {wall:.1f} s wall ({cpu / len(seeds):.2f} CPU s a seed)")
    for seed, found in failing.items():
        print(f"  seed {seed}: {'; '.join(found)[:400]}\n    reproduce: {command_for(seed)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
