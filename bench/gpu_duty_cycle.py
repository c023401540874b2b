"""On a real GPU: does the agent's duty cycle slow an opportunistic job to its share, and does a
guaranteed neighbour keep its throughput while the opportunistic job shares its GPU?

Launches compute-bound PyTorch jobs (a matrix product in a loop, logging its iteration count)
through the agent's own job runner and isolation layer (``agents.runner.JobRunner``, the path a
``LaunchJob`` takes on a node) and throttles them with ``JobRunner.set_duty_cycle``, the
SIGSTOP/SIGCONT time-slicer the scheduler's Throttle decisions drive. Three scenarios:

1. *solo*: the opportunistic job alone, at full speed: its solo figure; the guaranteed job alone:
   its solo figure;
2. *duty alone*: the opportunistic job alone, its duty cycle stepped 1.0 -> 0.5 -> 0.25 -> 0.1 -> 1.0
   (0.1 is the scheduler's floor): iterations/s per step against its solo figure; target: the
   ratio tracks the duty cycle within 10% (``--tolerance``);
3. *shared*: the guaranteed job unthrottled next to the opportunistic job stepped the same way:
   both jobs' iterations/s per step. An unthrottled neighbour slows the guaranteed job (the table
   says by how much); the targets are what the scheduler's throttling relies on: at the lowest
   duty cycle the guaranteed job keeps >= 95% of its solo figure (``--guaranteed-target``), and
   whenever it lost more than ``--slowdown-margin`` of its throughput, the SM utilisation the
   agent reports for it fell more than that margin below its solo reading (the rule
   ``jobs/scheduling/duty_cycles.py`` throttles on), so the scheduler sees the slowdown;
4. on a GPU the layer shares through MPS only: the opportunistic job relaunched at each of
   ``--mps-shares`` (``LaunchJob.compute_share``, which MPS turns into
   ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; it is read when CUDA starts, so a new share is a new
   process), next to the guaranteed job.

Every figure is the median over ``--repeats`` windows of ``--step-seconds``, each after
``--settle-seconds`` at the new setting; CPU seconds of each job (and of the bench itself) are
printed beside wall seconds, and the SM utilisation the agent's NVML backend reports (per job and
for the GPU, sampled once a second as the agent does) beside both.

    python -m bench.gpu_duty_cycle --isolation auto --repeats 3 --json duty.json

Needs an NVIDIA GPU and PyTorch; without them it says so and exits 2 at once. Never imports Django.
Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/gpu_duty_cycle.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_node import (  # noqa: E402
    EXIT_CANNOT_RUN,
    ISOLATION_FLAGS,
    CannotRun,
    Node,
    cpu_seconds,
    own_cpu_seconds,
    require_gpu,
    start_node,
)

from jobs.scheduling.config import SchedulerConfig  # noqa: E402 (pure: no Django)

BENCH = "gpu_duty_cycle"
GUARANTEED, OPPORTUNISTIC = 1, 2

# The job: a square matrix product in a loop, synchronised each time so that a SIGSTOP stops the
# GPU work within one product; every ~50 ms it appends "<unix time> <iterations so far>" to its
# progress file. Memory is fixed once warmed up, so the memory fences never get in the way.
JOB = r"""
import sys, time, torch
size, dtype, out = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3]
a = torch.randn(size, size, device="cuda", dtype=dtype)
b = torch.randn(size, size, device="cuda", dtype=dtype)
for _ in range(10):
    c = a @ b
torch.cuda.synchronize()
with open(out, "a", buffering=1) as progress:
    done, logged = 0, 0.0
    progress.write(f"{time.time():.6f} 0\n")
    while True:
        c = a @ b
        torch.cuda.synchronize()
        done += 1
        now = time.time()
        if now - logged >= 0.05:
            progress.write(f"{now:.6f} {done}\n")
            logged = now
"""


# ---------------------------------------------------------------- pure parts (unit-tested)


def parse_progress(text: str) -> list[tuple[float, int]]:
    """``(unix time, iterations)`` per line; a line cut short (the job stopped mid-write) is skipped."""
    points = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            points.append((float(parts[0]), int(parts[1])))
        except ValueError:
            continue
    return points


def iterations_per_second(points: list[tuple[float, int]], start: float, end: float) -> float | None:
    """The job's rate over ``[start, end]``: iterations done by ``end`` less those done by
    ``start``, over the window. The count at a time is the last one logged by then, which is
    exact while the job is stopped (it logs nothing and does nothing), so the stopped share of a
    duty cycle counts fully against the rate; ``None`` before the job's first line."""
    if end <= start:
        return None
    before_start = [count for stamp, count in points if stamp <= start]
    before_end = [count for stamp, count in points if stamp <= end]
    if not before_start or not before_end:
        return None
    return (before_end[-1] - before_start[-1]) / (end - start)


@dataclass
class Step:
    """One setting of one scenario, its figures the medians over the repeats."""

    scenario: str  # "solo", "duty alone", "shared", "mps share"
    setting: float  # the opportunistic job's duty cycle (or its MPS share)
    opportunistic: float | None = None  # iterations/s
    guaranteed: float | None = None
    opportunistic_cpu_s: float = 0.0  # per window, median
    guaranteed_cpu_s: float = 0.0
    # SM utilisation (%) as the agent's NVML backend reports it, the scheduler's only view of a
    # slowdown: per job (what throttling decides on) and for the GPU. None: no reading.
    opportunistic_util: float | None = None
    guaranteed_util: float | None = None
    gpu_util: float | None = None
    wall_s: float = 0.0
    samples: list[dict] = field(default_factory=list)


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def verdict(steps: list[Step], solo_opportunistic: float | None, solo_guaranteed: float | None, *,
            tolerance: float, guaranteed_target: float, slowdown_margin: float = 0.1,
            saturated_utilisation: float = 0.95, solo_guaranteed_util: float | None = None) -> tuple[bool, list[str]]:
    """Whether the targets hold, and one line per target saying how close each came.

    The guaranteed job is judged where the scheduler's throttling can take it, not at every step:
    an unthrottled neighbour slows it (the bench prints by how much), and what protects it is that
    the scheduler *sees* that slowdown and that the lowest duty cycle tried (the scheduler's floor
    by default) gives it back ``guaranteed_target`` of its solo throughput. The scheduler sees it by
    either rule of ``jobs/scheduling/duty_cycles.py``: the job's reported utilisation is more than
    ``slowdown_margin`` below its solo reading, or the GPU's is at ``saturated_utilisation`` or
    more (the only one left on an MPS GPU, where per-job utilisation is unknown)."""
    lines, ok = [], True
    tracked = [s for s in steps if s.scenario == "duty alone" and s.opportunistic is not None]
    if solo_opportunistic and tracked:
        errors = [(abs(s.opportunistic / solo_opportunistic / s.setting - 1.0), s) for s in tracked]
        worst, step = max(errors, key=lambda pair: pair[0])
        passed = worst <= tolerance
        ok &= passed
        lines.append(f"{'PASS' if passed else 'FAIL'}: the opportunistic job tracks its duty cycle within "
                     f"{tolerance:.0%} (worst: {step.opportunistic / solo_opportunistic:.1%} of solo at duty "
                     f"{step.setting:.2f}, off by {worst:.1%})")
    else:
        ok = False
        lines.append("FAIL: no figures for the opportunistic job alone")
    shared = [s for s in steps if s.scenario in ("shared", "mps share") and s.guaranteed is not None]
    throttled = [s for s in shared if s.scenario == "shared"]
    if solo_guaranteed and throttled:
        floor = min(throttled, key=lambda s: s.setting)
        kept = floor.guaranteed / solo_guaranteed
        worst = min(shared, key=lambda s: s.guaranteed)
        passed = kept >= guaranteed_target
        ok &= passed
        lines.append(f"{'PASS' if passed else 'FAIL'}: at duty {floor.setting:.2f} the guaranteed job keeps >= "
                     f"{guaranteed_target:.0%} of its solo throughput ({kept:.1%}; worst step: "
                     f"{worst.guaranteed / solo_guaranteed:.1%}, {worst.scenario} at {worst.setting:.2f})")
    else:
        ok = False
        lines.append("FAIL: no figures for the guaranteed job next to the opportunistic one")
    slowed = [s for s in shared if solo_guaranteed and s.guaranteed < (1.0 - slowdown_margin) * solo_guaranteed]
    if slowed:
        margin = slowdown_margin * 100.0

        def by_job(step: Step) -> bool:
            return (solo_guaranteed_util is not None and step.guaranteed_util is not None
                    and step.guaranteed_util < solo_guaranteed_util - margin)

        def by_gpu(step: Step) -> bool:
            return step.gpu_util is not None and step.gpu_util >= saturated_utilisation * 100.0

        hidden = [s for s in slowed if not (by_job(s) or by_gpu(s))]
        passed = not hidden
        ok &= passed
        solo_text = "no reading" if solo_guaranteed_util is None else f"{solo_guaranteed_util:.0f}%"
        if passed:
            lines.append(f"PASS: the scheduler throttles at each of the {len(slowed)} slowdowns of the guaranteed job "
                         f"past {slowdown_margin:.0%}: {sum(map(by_job, slowed))} seen in its own utilisation (more "
                         f"than {margin:.0f} points below solo, {solo_text}), {sum(map(by_gpu, slowed))} with the GPU "
                         f"saturated (>= {saturated_utilisation:.0%}, a rule that fires slowed or not)")
        else:
            named = ", ".join(f"{s.scenario} at {s.setting:.2f}: {s.guaranteed / solo_guaranteed:.0%} of solo "
                              f"throughput, job {'?' if s.guaranteed_util is None else f'{s.guaranteed_util:.0f}%'}"
                              f", GPU {'?' if s.gpu_util is None else f'{s.gpu_util:.0f}%'}"
                              for s in hidden)
            lines.append(f"FAIL: the scheduler cannot see the guaranteed job's slowdown (solo reading {solo_text}; "
                         f"{named})")
    return ok, lines


def table(steps: list[Step], solo_opportunistic: float | None, solo_guaranteed: float | None) -> str:
    """The steps as a fixed-width table, each rate beside its share of the job's solo figure."""

    def rate(value, solo):
        if value is None:
            return f"{'-':>10} {'':>7}"
        share = f"{value / solo:.1%}" if solo else "?"
        return f"{value:>10.1f} {share:>7}"

    def util(value):
        return f"{'-':>5}" if value is None else f"{value:>5.0f}"

    lines = [f"{'scenario':<11} {'setting':>7} | {'opp. it/s':>10} {'vs solo':>7} {'CPU s':>6} {'SM %':>5} | "
             f"{'guar. it/s':>10} {'vs solo':>7} {'CPU s':>6} {'SM %':>5} | {'GPU %':>5} {'wall s':>6}"]
    for s in steps:
        lines.append(f"{s.scenario:<11} {s.setting:>7.2f} | {rate(s.opportunistic, solo_opportunistic)} "
                     f"{s.opportunistic_cpu_s:>6.2f} {util(s.opportunistic_util)} | "
                     f"{rate(s.guaranteed, solo_guaranteed)} {s.guaranteed_cpu_s:>6.2f} {util(s.guaranteed_util)} | "
                     f"{util(s.gpu_util)} {s.wall_s:>6.1f}")
    return "\n".join(lines)


def fraction_list(text: str) -> list[float]:
    """``"1,0.5,0.25"`` -> ``[1.0, 0.5, 0.25]``, each in (0, 1]."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions separated by commas, e.g. 1,0.5,0.25; got {text!r}")
    if not values or not all(0 < value <= 1 for value in values):
        raise argparse.ArgumentTypeError(f"each fraction must be in (0, 1]; got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_duty_cycle",
                                     description=" ".join(__doc__.split("\n\n")[0].split()),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--isolation", choices=ISOLATION_FLAGS, default=ISOLATION_FLAGS[0],
                        help="how the agent fences jobs that share the GPU (python -m agents --isolation)")
    parser.add_argument("--gpu", type=int, default=0, help="the device index (as the agent numbers it)")
    parser.add_argument("--duties", type=fraction_list, default=[1.0, 0.5, 0.25, 0.1, 1.0],
                        help="the opportunistic job's duty cycles, in order")
    parser.add_argument("--mps-shares", type=fraction_list, default=[1.0, 0.5, 0.25],
                        help="compute shares to relaunch the opportunistic job at, where the GPU is shared through MPS")
    parser.add_argument("--opportunistic-share", type=float, default=0.5,
                        help="the opportunistic job's LaunchJob.compute_share in the other scenarios")
    parser.add_argument("--size", type=int, default=8192, help="matrix side of the jobs' products")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    parser.add_argument("--step-seconds", type=float, default=6.0, help="length of one measured window")
    parser.add_argument("--settle-seconds", type=float, default=1.5, help="wait after each change before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="windows per step; the median is reported")
    parser.add_argument("--duty-period", type=float, default=1.0,
                        help="the duty cycler's period (the agent's default)")
    parser.add_argument("--memory-limit-mib", type=int, default=4096,
                        help="each job's LaunchJob.gpu_memory_limit_mib (its fence where the GPU has one)")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="how far the opportunistic job's share of its solo figure may stray from its duty cycle")
    parser.add_argument("--guaranteed-target", type=float, default=0.95,
                        help="share of its solo figure the guaranteed job must keep")
    parser.add_argument("--slowdown-margin", type=float, default=SchedulerConfig().slowdown_margin,
                        help="the scheduler's: a guaranteed job is slowed when its utilisation is this far below solo")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.step_seconds <= 0 or args.settle_seconds < 0:
        parser.error("--repeats must be >= 1, --step-seconds > 0 and --settle-seconds >= 0")
    if not 0 < args.opportunistic_share <= 1:
        parser.error("--opportunistic-share must be in (0, 1]")
    return args


# ---------------------------------------------------------------- the run (needs a GPU)


class Bench:
    # (The clock the agent readings are paced by; tests give a bench their own.)
    clock = staticmethod(time.time)
    sleep = staticmethod(time.sleep)

    def __init__(self, node: Node, args: argparse.Namespace):
        self.node, self.args = node, args
        self.progress = {job_id: node.workdir / f"progress-{job_id}.log" for job_id in (GUARANTEED, OPPORTUNISTIC)}
        self.next_job = 10

    def launch(self, role: int, compute_share: float | None) -> int:
        """Start a fresh job in ``role`` and wait until it iterates; returns its job id."""
        job_id = self.next_job = self.next_job + 1
        path = self.progress[role]
        path.write_text("")
        self.node.launch(job_id, JOB, [str(self.args.size), self.args.dtype, str(path)], self.args.gpu,
                         gpu_memory_limit_mib=self.args.memory_limit_mib, compute_share=compute_share)
        deadline = time.monotonic() + 180
        while not parse_progress(path.read_text()):
            done = self.node.finished(job_id, 0.2)
            if done is not None:
                raise RuntimeError(f"job {job_id} exited before it iterated (code {done.exit_code}): "
                                   f"{done.error or ''}\n{done.output_tail[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} did not start iterating within 180 s:\n{self.node.output(job_id)}")
        return job_id

    def measure(self, scenario: str, setting: float, jobs: dict[int, int]) -> Step:
        """``jobs``: role -> job id. Windows of ``--step-seconds`` after a settle, medians kept."""
        windows = []
        started = time.monotonic()
        for _ in range(self.args.repeats):
            time.sleep(self.args.settle_seconds)
            cpu_before = {role: cpu_seconds(self.node.runner.processes()[job_id].pid) for role, job_id in jobs.items()}
            start = time.time()
            readings = self.read_agent(jobs, start + self.args.step_seconds)
            end = time.time()
            time.sleep(0.1)  # the last progress line before `end` is written
            window = {"start": start, "end": end, **readings}
            for role, job_id in jobs.items():
                pid = self.node.runner.processes()[job_id].pid
                window[role] = iterations_per_second(parse_progress(self.progress[role].read_text()), start, end)
                window[f"cpu_{role}"] = cpu_seconds(pid) - cpu_before[role]
            windows.append(window)
        return Step(
            scenario=scenario, setting=setting,
            opportunistic=median(w.get(OPPORTUNISTIC) for w in windows),
            guaranteed=median(w.get(GUARANTEED) for w in windows),
            opportunistic_cpu_s=median(w.get(f"cpu_{OPPORTUNISTIC}", 0.0) for w in windows) or 0.0,
            guaranteed_cpu_s=median(w.get(f"cpu_{GUARANTEED}", 0.0) for w in windows) or 0.0,
            opportunistic_util=median(w.get(f"util_{OPPORTUNISTIC}") for w in windows),
            guaranteed_util=median(w.get(f"util_{GUARANTEED}") for w in windows),
            gpu_util=median(w.get("util_gpu") for w in windows),
            wall_s=time.monotonic() - started, samples=windows,
        )

    def read_agent(self, jobs: dict[int, int], until: float) -> dict[str, float | None]:
        """Sample the agent's NVML backend about once a second until ``until`` (unix time), as the
        agent does, and return the medians of what it reported: each job's SM utilisation on the
        bench's GPU (``util_<role>``) and the GPU's own (``util_gpu``)."""
        per_job: dict[int, list[float]] = {job_id: [] for job_id in jobs.values()}
        gpu: list[float] = []
        while (left := until - self.clock()) > 0:
            self.sleep(min(1.0, left))
            sample = self.node.backend.sample(self.node.runner.processes())
            if self.node.layer is not None:
                sample = self.node.layer.readable(sample)  # what the agent reports, not the raw reading
            gpu += [g.util_sm for g in sample.gpus if g.index == self.args.gpu and g.util_sm is not None]
            for job in sample.jobs:
                if job.gpu_index == self.args.gpu and job.job_id in per_job and job.util_sm is not None:
                    per_job[job.job_id].append(job.util_sm)
        readings = {f"util_{role}": median(per_job[job_id]) for role, job_id in jobs.items()}
        readings["util_gpu"] = median(gpu)
        return readings

    def stepped(self, scenario: str, jobs: dict[int, int]) -> list[Step]:
        steps = []
        for duty in self.args.duties:
            self.node.runner.set_duty_cycle(jobs[OPPORTUNISTIC], duty)
            steps.append(self.measure(scenario, duty, jobs))
            print(table([steps[-1]], None, None).splitlines()[-1], flush=True)
        self.node.runner.set_duty_cycle(jobs[OPPORTUNISTIC], 1.0)
        return steps

    def run(self) -> tuple[list[Step], Step, Step]:
        args, node = self.args, self.node
        opportunistic = self.launch(OPPORTUNISTIC, args.opportunistic_share)
        solo_opp = self.measure("solo", 1.0, {OPPORTUNISTIC: opportunistic})
        steps = self.stepped("duty alone", {OPPORTUNISTIC: opportunistic})
        node.stop(opportunistic)
        guaranteed = self.launch(GUARANTEED, None)
        solo_guar = self.measure("solo", 1.0, {GUARANTEED: guaranteed})
        opportunistic = self.launch(OPPORTUNISTIC, args.opportunistic_share)
        steps += self.stepped("shared", {GUARANTEED: guaranteed, OPPORTUNISTIC: opportunistic})
        node.stop(opportunistic)
        if node.mode(args.gpu) == "mps":
            for share in args.mps_shares:
                opportunistic = self.launch(OPPORTUNISTIC, share)
                steps.append(self.measure("mps share", share, {GUARANTEED: guaranteed, OPPORTUNISTIC: opportunistic}))
                node.stop(opportunistic)
        node.stop(guaranteed)
        return steps, solo_opp, solo_guar


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall, cpu = time.monotonic(), own_cpu_seconds()
    try:
        require_gpu(BENCH)
        node = start_node(BENCH, args.isolation, duty_period=args.duty_period)
    except CannotRun as exc:
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_RUN
    try:
        gpu = node.gpu(args.gpu)
        print(f"GPU {gpu.index}: {gpu.model}, {gpu.memory_mib} MiB, isolation {node.mode(args.gpu)}"
              f"{f' (MIG {gpu.mig_profile})' if gpu.mig_profile else ''}; {args.size}x{args.size} {args.dtype} "
              f"products; duty period {args.duty_period} s; median of {args.repeats} x {args.step_seconds} s")
        steps, solo_opp, solo_guar = Bench(node, args).run()
    except RuntimeError as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return 1
    finally:
        node.close()
    solo_o, solo_g = solo_opp.opportunistic, solo_guar.guaranteed
    print()
    print(table([solo_opp, solo_guar, *steps], solo_o, solo_g))
    ok, lines = verdict(steps, solo_o, solo_g, tolerance=args.tolerance, guaranteed_target=args.guaranteed_target,
                        slowdown_margin=args.slowdown_margin,
                        saturated_utilisation=SchedulerConfig().saturated_utilisation,
                        solo_guaranteed_util=solo_guar.guaranteed_util)
    print("\n".join(lines))
    print(f"bench: {time.monotonic() - wall:.0f} s wall, {own_cpu_seconds() - cpu:.1f} s CPU (this process)")
    if args.json:
        args.json.write_text(json.dumps({"solo": [asdict(solo_opp), asdict(solo_guar)],
                                         "steps": [asdict(s) for s in steps], "ok": ok, "verdict": lines}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
