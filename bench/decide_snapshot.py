"""The pure core on the scheduling loop's own snapshots, without a database: ``decide()`` as the
loop runs it, with the carry its previous cycle left.

    python bench/scheduling_loop.py --repeat 1 --save-snapshots /tmp/loop.pkl   # once (needs a database)
    python bench/decide_snapshot.py /tmp/loop.pkl                              # CPU per cycle

``steady``: nothing changed since the cycle before (the carry of that cycle); ``churn``: 8 jobs
ended since (the carry of a steady cycle); ``fresh``: no carry. Prints min and median CPU.

CPU time on a shared 2-core machine moves by a third between identical runs. To compare two
trees, count instructions instead, which do not move (``--cycles 0`` pays the set-up alone):

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        python bench/decide_snapshot.py /tmp/loop.pkl --only steady --cycles 0   # then --cycles 3

and take (I refs at 3 - I refs at 0) / 3, with PYTHONHASHSEED=0 for both.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.scheduling import decide  # noqa: E402
from jobs.scheduling.carry import Carry  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", help="a file written by bench/scheduling_loop.py --save-snapshots")
    parser.add_argument("--cycles", type=int, default=9)
    parser.add_argument("--only", choices=["steady", "churn", "fresh"])
    args = parser.parse_args(argv)
    with open(args.snapshots, "rb") as file:
        saved = pickle.load(file)
    steady, churn, now, config = saved["steady"], saved["churn"], saved["now"], saved["config"]

    def cycle(kind: str) -> float:
        carry = None
        if kind != "fresh":
            carry = Carry()
            decide(steady, now, config, carry)  # what the cycle before left
        snapshot = churn if kind == "churn" else steady
        gc.collect()
        started = time.process_time()
        decide(snapshot, now, config, carry)
        return time.process_time() - started

    print(f"decide() on the loop's snapshots: {len(steady.pending)} pending, {len(steady.running)} running, "
          f"{sum(len(n.gpus) for n in steady.nodes)} GPUs")
    for kind in [args.only] if args.only else ["steady", "churn", "fresh"]:
        cpu = [cycle(kind) for _ in range(args.cycles)]
        if cpu:
            print(f"  {kind:7s}: CPU min {min(cpu) * 1000:.0f} ms, median {statistics.median(cpu) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
