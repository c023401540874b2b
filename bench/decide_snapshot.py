"""The pure core on the scheduling loop's own snapshots, without a database: ``decide()`` as the
loop runs it, with the carry its previous cycle left.

    python bench/scheduling_loop.py --repeat 1 --save-snapshots /tmp/loop.pkl   # once (needs a database)
    python bench/decide_snapshot.py /tmp/loop.pkl                              # CPU per cycle

``steady``: nothing changed since the cycle before (the carry of that cycle); ``churn``: 8 jobs
ended since (the carry of a steady cycle); ``arrivals``: ``--arrivals`` jobs were submitted since,
one to each of as many tenants (copies of queued requests, submitted now: what a busy cluster sees
every cycle); ``cordon``: one node was cordoned since (the inventory changed, no request became
impossible); ``fresh``: the steady snapshot without a carry (a restarted scheduler); ``room``:
the loop's first snapshot, a cluster with room (some 2,700 placements), without a carry. A
carried cycle runs ``--step`` seconds after the cycle before it, as the loop's do (gangs age out
of their one-node wait, holds run out). Prints min and median CPU.

CPU time on a shared 2-core machine moves by a third between identical runs. To compare two
trees, count instructions instead, which do not move. A carried cycle first needs the cycle
before it, which ``--setup-only`` runs alone:

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        python bench/decide_snapshot.py /tmp/loop.pkl --only steady --cycles 3 --setup-only   # then without

and take (I refs without - I refs with) / 3, with PYTHONHASHSEED=0 for both.

A change that should only be faster must not change a decision: ``--digest`` runs each kind's
cycle once, untimed, and prints a sha256 of the repr of what ``decide()`` returned. Compare the
digests of two trees, with PYTHONHASHSEED=0 for both.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.scheduling import decide  # noqa: E402
from jobs.scheduling.carry import Carry  # noqa: E402
from jobs.scheduling.snapshot import ClusterSnapshot, JobRequest  # noqa: E402


KINDS = ["steady", "churn", "arrivals", "cordon", "fresh", "room"]


def with_arrivals(snapshot: ClusterSnapshot, count: int, now: float) -> ClusterSnapshot:
    """``snapshot`` with ``count`` new jobs, one each for the first ``count`` tenants that have a
    queue (a copy of that tenant's first queued request under a new id, submitted ``now``)."""
    first: dict[str, JobRequest] = {}
    for job in snapshot.pending:
        first.setdefault(job.tenant, job)
    next_id = max(job.id for job in snapshot.pending) + 1
    new = [dataclasses.replace(job, id=next_id + i, submitted_at=now, reserved_since=None)
           for i, job in enumerate(list(first.values())[:count])]
    return dataclasses.replace(snapshot, pending=snapshot.pending + tuple(new))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", help="a file written by bench/scheduling_loop.py --save-snapshots")
    parser.add_argument("--cycles", type=int, default=9)
    parser.add_argument("--only", choices=KINDS)
    parser.add_argument("--arrivals", type=int, default=20, help="jobs submitted before an arrivals cycle")
    parser.add_argument("--step", type=float, default=2.0,
                        help="seconds from the cycle before to a carried cycle (the scheduler's interval; 0: "
                             "the same instant, as this bench had it before)")
    parser.add_argument("--setup-only", action="store_true",
                        help="run each cycle's set-up (the cycle before it) but not the cycle: see above")
    parser.add_argument("--digest", action="store_true",
                        help="print a sha256 of each kind's decisions (one untimed cycle) instead of timing")
    args = parser.parse_args(argv)
    with open(args.snapshots, "rb") as file:
        saved = pickle.load(file)
    steady, churn, now, config = saved["steady"], saved["churn"], saved["now"], saved["config"]
    arrivals = with_arrivals(steady, args.arrivals, now)
    cordon = dataclasses.replace(steady, nodes=(dataclasses.replace(steady.nodes[0], cordoned=True),
                                                *steady.nodes[1:]))

    def setup(kind: str) -> tuple[ClusterSnapshot, Carry | None]:
        carry = None
        if kind not in ("fresh", "room"):
            carry = Carry()
            decide(steady, now, config, carry)  # what the cycle before left
        snapshot = {"churn": churn, "arrivals": arrivals, "cordon": cordon, "room": saved.get("room")}.get(kind, steady)
        return snapshot, carry

    def step(kind: str) -> float:
        return 0.0 if kind in ("fresh", "room") else args.step

    def cycle(kind: str) -> float:
        snapshot, carry = setup(kind)
        gc.collect()
        started = time.process_time()
        if not args.setup_only:
            decide(snapshot, now + step(kind), config, carry)
        return time.process_time() - started

    print(f"decide() on the loop's snapshots: {len(steady.pending)} pending, {len(steady.running)} running, "
          f"{sum(len(n.gpus) for n in steady.nodes)} GPUs")
    for kind in [args.only] if args.only else KINDS:
        if kind == "room" and "room" not in saved:
            continue  # (a file saved before the first snapshot was)
        if args.digest:
            snapshot, carry = setup(kind)
            decisions = decide(snapshot, now + step(kind), config, carry)
            print(f"  {kind:7s}: sha256 {hashlib.sha256(repr(decisions).encode()).hexdigest()}")
            continue
        cpu = [cycle(kind) for _ in range(args.cycles)]
        if cpu:
            print(f"  {kind:7s}: CPU min {min(cpu) * 1000:.0f} ms, median {statistics.median(cpu) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
