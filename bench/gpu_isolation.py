"""On a real GPU: when an opportunistic job tries to allocate past its cap, is it the one that gets
CUDA out of memory, and does its guaranteed neighbour run on?

Through the agent's own job runner and isolation layer (``--isolation``, as ``python -m agents``
takes it), on one GPU:

1. the guaranteed job (``LaunchJob.gpu_memory_limit_mib`` = its reservation, no compute share)
   allocates ``--guaranteed-gib`` and computes, logging its iteration count;
2. the opportunistic job (cap ``--cap-gib``, compute share ``--opportunistic-share``) allocates
   ``--step-mib`` at a time towards ``--try-gib`` (default: the whole GPU) until an allocation
   fails, then holds what it got for ``--hold-seconds`` and exits with the error;
3. while it holds, the guaranteed job grows by ``--grow-gib``, still inside its reservation.

Fenced (``mps``, ``memory_limit``): the opportunistic job fails at its cap, the guaranteed job
grows and computes on. Unfenced: the opportunistic job fills the GPU, and the guaranteed job's
growth is what fails; the bench shows that too (and exits 1), which is why a node must not pack
jobs on an unfenced GPU unless they accept it. The agent's wording of the failure
(``IsolationLayer.memory_pressure_error``, what the job's exit reports) is printed where it has one.

    python -m bench.gpu_isolation --isolation auto --guaranteed-gib 20 --cap-gib 8

Needs an NVIDIA GPU and PyTorch; without them it says so and exits 2 at once. Never imports Django.
Exit status 0 when the opportunistic job got the OOM at its cap and the guaranteed job ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/gpu_isolation.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_node import (  # noqa: E402
    EXIT_CANNOT_RUN,
    GIB,
    ISOLATION_FLAGS,
    CannotRun,
    Node,
    cpu_seconds,
    own_cpu_seconds,
    require_gpu,
    start_node,
)
from bench.gpu_duty_cycle import iterations_per_second, parse_progress  # noqa: E402

BENCH = "gpu_isolation"
GUARANTEED, OPPORTUNISTIC = 1, 2
#: What a job's reservation holds beyond its tensors: the CUDA context, cuBLAS workspace, the
#: caching allocator's rounding.
HEADROOM_MIB = 1536

# The guaranteed job: hold GIB, compute, and log "<time> <iterations>" to PROGRESS; when the
# GROW file appears, allocate GROW_GIB more and say how that went in STATUS.
GUARANTEED_JOB = r"""
import os, sys, time, torch
gib, grow_gib, progress_path, status_path, grow_path = sys.argv[1:6]
status = open(status_path, "a", buffering=1)
held = torch.empty(int(float(gib) * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(2048, 2048, device="cuda")
status.write(f"ready {torch.cuda.memory_reserved() // 2**20}\n")
grown = None
with open(progress_path, "a", buffering=1) as progress:
    done, logged = 0, 0.0
    while True:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        done += 1
        now = time.time()
        if now - logged >= 0.05:
            progress.write(f"{now:.6f} {done}\n")
            logged = now
        if grown is None and os.path.exists(grow_path):
            try:
                grown = torch.empty(int(float(grow_gib) * 2**30), dtype=torch.uint8, device="cuda")
                status.write(f"grew {torch.cuda.memory_reserved() // 2**20}\n")
            except RuntimeError as exc:  # OutOfMemoryError, or a driver's "CUDA error: out of memory"
                if "out of memory" not in str(exc).lower():
                    raise
                status.write("grow failed " + str(exc).splitlines()[0] + "\n")
                raise
"""

# The opportunistic job: allocate STEP_MIB at a time up to TRY_MIB; at the first failure say how
# much it held, hold it for HOLD seconds, then exit with the error (as a real job would).
OPPORTUNISTIC_JOB = r"""
import sys, time, torch
step_mib, try_mib, hold, status_path = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
status = open(status_path, "a", buffering=1)
chunks = []
try:
    while len(chunks) * step_mib < try_mib:
        chunks.append(torch.empty(step_mib * 2**20, dtype=torch.uint8, device="cuda"))
        status.write(f"held {len(chunks) * step_mib}\n")
except RuntimeError as exc:  # OutOfMemoryError, or a driver's "CUDA error: out of memory"
    if "out of memory" not in str(exc).lower():
        raise
    status.write(f"failed {len(chunks) * step_mib} " + str(exc).splitlines()[0] + "\n")
    time.sleep(hold)
    raise
status.write(f"reached {len(chunks) * step_mib}\n")
time.sleep(hold)
"""


# ---------------------------------------------------------------- pure parts (unit-tested)


@dataclass
class Outcome:
    """What the two jobs did, read from their status files and exits."""

    cap_mib: int
    step_mib: int
    opportunistic_held_mib: int = 0  # when its allocation failed, or when it stopped trying
    opportunistic_failed: bool = False
    opportunistic_error: str = ""
    opportunistic_exit: int | None = None
    guaranteed_ready: bool = False
    guaranteed_grew: bool | None = None  # None: it was never asked (or never answered)
    guaranteed_error: str = ""
    guaranteed_running_after: bool = False
    guaranteed_rate_before: float | None = None
    guaranteed_rate_after: float | None = None
    agent_wording: str | None = None


def read_status(text: str, outcome: Outcome, role: int) -> None:
    """Fold the status lines a job wrote into ``outcome``."""
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if role == OPPORTUNISTIC and word in ("held", "failed", "reached"):
            figure, _, error = rest.partition(" ")
            if figure.isdigit():
                outcome.opportunistic_held_mib = int(figure)
            if word == "failed":
                outcome.opportunistic_failed, outcome.opportunistic_error = True, error
        elif role == GUARANTEED and word == "ready":
            outcome.guaranteed_ready = True
        elif role == GUARANTEED and word == "grew":
            outcome.guaranteed_grew = True
        elif role == GUARANTEED and word == "grow":
            outcome.guaranteed_grew, outcome.guaranteed_error = False, rest.removeprefix("failed ")


def verdict(outcome: Outcome) -> tuple[bool, list[str]]:
    """Who got the OOM, whether at the cap, and whether the guaranteed job ran on."""
    lines = []
    # The cap counts the CUDA context too, so the job may fail a step or so below it, never
    # more than a step (plus the context) above.
    at_cap = outcome.opportunistic_failed and outcome.opportunistic_held_mib <= outcome.cap_mib + outcome.step_mib
    if outcome.opportunistic_failed:
        where = "at its cap" if at_cap else "past its cap (the GPU was full: nothing fenced it)"
        lines.append(f"opportunistic job: allocation failed holding {outcome.opportunistic_held_mib} MiB, "
                     f"{where} of {outcome.cap_mib} MiB: {outcome.opportunistic_error}")
    else:
        lines.append(f"opportunistic job: no allocation failed; it held {outcome.opportunistic_held_mib} MiB "
                     f"against a cap of {outcome.cap_mib} MiB")
    if outcome.guaranteed_grew is False:
        lines.append(f"guaranteed job: GOT THE OOM growing inside its reservation: {outcome.guaranteed_error}")
    elif outcome.guaranteed_grew:
        lines.append("guaranteed job: grew inside its reservation while the opportunistic job held its memory")
    else:
        lines.append("guaranteed job: never got to grow (it did not start, or did not answer)")
    rates = (outcome.guaranteed_rate_before, outcome.guaranteed_rate_after)
    if None not in rates:
        lines.append(f"guaranteed job: {rates[0]:.1f} it/s before, {rates[1]:.1f} it/s after; "
                     f"{'still running' if outcome.guaranteed_running_after else 'NOT running'} at the end")
    if outcome.agent_wording:
        lines.append(f"agent's report of the opportunistic exit: {outcome.agent_wording}")
    ok = at_cap and outcome.guaranteed_grew is True and outcome.guaranteed_running_after
    oom = "the opportunistic job" if outcome.opportunistic_failed else "no job"
    if outcome.guaranteed_grew is False:
        oom = "the guaranteed job" + (" (and the opportunistic one)" if outcome.opportunistic_failed else "")
    lines.append(f"{'PASS' if ok else 'FAIL'}: {oom} got the OOM; the guaranteed job "
                 f"{'ran on' if outcome.guaranteed_running_after and outcome.guaranteed_grew else 'did not run on'}")
    return ok, lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_isolation",
                                     description=" ".join(__doc__.split("\n\n")[0].split()),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--isolation", choices=ISOLATION_FLAGS, default=ISOLATION_FLAGS[0],
                        help="how the agent fences jobs that share the GPU (python -m agents --isolation)")
    parser.add_argument("--gpu", type=int, default=0, help="the device index (as the agent numbers it)")
    parser.add_argument("--guaranteed-gib", type=float, default=20.0,
                        help="what the guaranteed job holds from the start")
    parser.add_argument("--grow-gib", type=float, default=4.0, help="what it adds later, inside its reservation")
    parser.add_argument("--cap-gib", type=float, default=8.0,
                        help="the opportunistic job's gpu_memory_limit_mib, in GiB")
    parser.add_argument("--try-gib", type=float, default=None, help="how far it tries to go (default: the whole GPU)")
    parser.add_argument("--step-mib", type=int, default=512, help="its allocation step")
    parser.add_argument("--opportunistic-share", type=float, default=0.25, help="its LaunchJob.compute_share")
    parser.add_argument("--hold-seconds", type=float, default=10.0, help="how long it holds its memory after failing")
    parser.add_argument("--timeout", type=float, default=240.0, help="give up on a job after this many seconds")
    parser.add_argument("--json", type=Path, help="also write the outcome here")
    args = parser.parse_args(argv)
    if min(args.guaranteed_gib, args.grow_gib, args.cap_gib) <= 0 or args.step_mib <= 0:
        parser.error("sizes must be positive")
    if not 0 < args.opportunistic_share <= 1:
        parser.error("--opportunistic-share must be in (0, 1]")
    return args


# ---------------------------------------------------------------- the run (needs a GPU)


def wait_until(predicate, timeout: float, what: str, node: Node, *job_ids: int):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for job_id in job_ids:
            done = node.exits.get(job_id) or node.finished(job_id, 0)
            if done is not None:
                raise RuntimeError(f"job {job_id} exited (code {done.exit_code}) while waiting for {what}:\n"
                                   f"{done.output_tail[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def run(node: Node, args: argparse.Namespace) -> Outcome:
    gpu = node.gpu(args.gpu)
    cap_mib = int(args.cap_gib * GIB)
    try_mib = int(args.try_gib * GIB) if args.try_gib else gpu.memory_mib
    outcome = Outcome(cap_mib=cap_mib, step_mib=args.step_mib)
    files = {name: node.workdir / f"{name}.txt" for name in ("g-progress", "g-status", "grow", "o-status")}
    for path in files.values():
        path.unlink(missing_ok=True)
    files["g-progress"].write_text("")
    files["g-status"].write_text("")
    files["o-status"].write_text("")

    reservation = int((args.guaranteed_gib + args.grow_gib) * GIB) + HEADROOM_MIB
    node.launch(GUARANTEED, GUARANTEED_JOB,
                [str(args.guaranteed_gib), str(args.grow_gib), str(files["g-progress"]), str(files["g-status"]),
                 str(files["grow"])], args.gpu, gpu_memory_limit_mib=reservation)
    # Ready and iterating: its rate before the opportunistic job starts needs a progress line
    # from before then (its first product, cuBLAS set-up included, can take a while).
    wait_until(lambda: "ready" in files["g-status"].read_text() and parse_progress(files["g-progress"].read_text()),
               args.timeout, "the guaranteed job to allocate and compute", node, GUARANTEED)
    print(f"guaranteed job: holds {args.guaranteed_gib} GiB, reservation {reservation} MiB", flush=True)

    before_start = time.time()
    node.launch(OPPORTUNISTIC, OPPORTUNISTIC_JOB,
                [str(args.step_mib), str(try_mib), str(args.hold_seconds), str(files["o-status"])],
                args.gpu, gpu_memory_limit_mib=cap_mib, compute_share=args.opportunistic_share)
    wait_until(lambda: any(w in files["o-status"].read_text() for w in ("failed", "reached")), args.timeout,
               "the opportunistic job to fail or reach its target", node, OPPORTUNISTIC)
    read_status(files["o-status"].read_text(), outcome, OPPORTUNISTIC)
    before_end = time.time()
    print(f"opportunistic job: stopped allocating at {outcome.opportunistic_held_mib} MiB "
          f"({'failed' if outcome.opportunistic_failed else 'reached its target'})", flush=True)

    files["grow"].write_text("now")
    try:
        wait_until(lambda: any(w in files["g-status"].read_text() for w in ("grew", "grow failed")),
                   min(args.timeout, args.hold_seconds + 30), "the guaranteed job to grow", node, GUARANTEED)
    except RuntimeError as exc:
        print(f"guaranteed job: {exc}", flush=True)
    after_start = time.time()
    time.sleep(3.0)
    after_end = time.time()
    time.sleep(0.1)
    read_status(files["g-status"].read_text(), outcome, GUARANTEED)
    progress = parse_progress(files["g-progress"].read_text())
    outcome.guaranteed_rate_before = iterations_per_second(progress, before_start, before_end)
    outcome.guaranteed_rate_after = iterations_per_second(progress, after_start, after_end)

    done = node.finished(OPPORTUNISTIC, args.hold_seconds + 30)
    if done is not None:
        outcome.opportunistic_exit = done.exit_code
        words = getattr(node.layer, "memory_pressure_error", None)
        if words is not None:
            outcome.agent_wording = words(OPPORTUNISTIC, done.output_tail, done.gpu_indices,
                                          done.gpu_memory_limit_mib, {})
    outcome.guaranteed_running_after = GUARANTEED in node.runner.running() and node.finished(GUARANTEED, 0) is None
    guaranteed = node.runner.processes().get(GUARANTEED)
    if guaranteed is not None:
        print(f"guaranteed job: {cpu_seconds(guaranteed.pid):.1f} s CPU so far", flush=True)
    return outcome


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall, cpu = time.monotonic(), own_cpu_seconds()
    try:
        require_gpu(BENCH)
        node = start_node(BENCH, args.isolation)
    except CannotRun as exc:
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_RUN
    try:
        gpu = node.gpu(args.gpu)
        print(f"GPU {gpu.index}: {gpu.model}, {gpu.memory_mib} MiB, isolation {node.mode(args.gpu)}"
              f"{f' (MIG {gpu.mig_profile})' if gpu.mig_profile else ''}", flush=True)
        outcome = run(node, args)
    except RuntimeError as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return 1
    finally:
        node.close()
    ok, lines = verdict(outcome)
    print("\n".join(lines))
    print(f"bench: {time.monotonic() - wall:.0f} s wall, {own_cpu_seconds() - cpu:.1f} s CPU (this process)")
    if args.json:
        args.json.write_text(json.dumps({"outcome": asdict(outcome), "ok": ok, "verdict": lines}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
