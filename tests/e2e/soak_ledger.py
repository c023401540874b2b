"""The soak's ledger (issue 35): every run of a soak job appends one line when it starts and one
when it ends, and the counts are read from those lines and the jobs' final states.

A line is ``<event> <job> <attempt> <node> <pid> <unix time>``, written with one ``write`` on an
``O_APPEND`` file, so concurrent runs never interleave inside a line. A run is one process: its
``start`` and ``end`` share job, node and pid. The attempt comes from the launch the agent spawned
the run for (``launch-<job>-<attempt>`` in the job directory's spawn record).

Pure: no Django, no Redis; the test hands in the final states and the attempts requeued because
their node was declared lost.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Run with: python -c JOB_SCRIPT <ledger directory> <seconds to run>. Besides the ledger it takes
# an exclusive, non-blocking flock on its job and on each GPU it was given, and writes a
# violation when one is already held (a lock dies with its process, SIGKILL included, so only a
# live overlap trips it), as tests/e2e/test_chaos.py's jobs do.
JOB_SCRIPT = r"""
import fcntl, json, os, sys, time
out, run_s = sys.argv[1], float(sys.argv[2])
job = os.environ["COLONY_JOB_ID"]
node = next((p[len("agent-"):] for p in os.getcwd().split(os.sep) if p.startswith("agent-")), "?")
try:
    with open(os.path.join(os.getcwd(), os.pardir, "spawned.json")) as f:
        attempt = json.load(f)["launch_id"].rsplit("-", 1)[1]
except (OSError, ValueError, KeyError, IndexError):
    attempt = "?"
def note(event):
    fd = os.open(os.path.join(out, "ledger.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.write(fd, f"{event} {job} {attempt} {node} {os.getpid()} {time.time():.6f}\n".encode())
    os.close(fd)
held = []
def hold(name):
    f = open(os.path.join(out, name + ".lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        with open(os.path.join(out, "violations.txt"), "a") as v:
            v.write(f"{name} held when job {job} attempt {attempt} started\n")
    held.append(f)
hold(f"job-{job}")
for gpu in os.environ["CUDA_VISIBLE_DEVICES"].split(","):
    hold(f"gpu-{node}-{gpu}")
note("start")
time.sleep(run_s)
note("end")
"""


@dataclass
class Run:
    job: int
    attempt: str
    node: str
    pid: int
    started: float
    ended: float | None = None


@dataclass
class Counts:
    """What a soak found. The four the issue holds to 0 are ``completed_twice``, ``run_twice``,
    ``lost`` and ``stuck``; ``overlapped`` (two live runs of one job) must be 0 too. Re-runs that
    the protocol allows are counted apart: ``retried_after_loss`` (the earlier run never
    completed: preempted, stopped or killed) and ``rerun_after_declared_loss`` (the earlier run completed on
    a node the control plane then declared lost: it cannot tell a pause past its grace from a
    death), and ``completed_again_after_declared_loss`` the jobs such a re-run completed again."""

    jobs: int = 0
    runs_started: int = 0
    runs_completed: int = 0
    completed_twice: list[int] = field(default_factory=list)
    completed_again_after_declared_loss: list[int] = field(default_factory=list)
    run_twice: list[int] = field(default_factory=list)
    overlapped: list[int] = field(default_factory=list)
    retried_after_loss: list[int] = field(default_factory=list)
    rerun_after_declared_loss: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)

    def violations(self) -> dict[str, list[int]]:
        """The counts that must be empty, by name, with the jobs in each."""
        return {name: getattr(self, name) for name in ("completed_twice", "run_twice", "overlapped", "lost", "stuck")}

    def summary(self) -> str:
        def n(jobs: list[int]) -> str:
            return f"{len(jobs)}" + (f" {sorted(jobs)[:12]}" if jobs else "")

        return (f"{self.jobs} jobs; runs started {self.runs_started}, completed {self.runs_completed}; "
                f"completed twice {n(self.completed_twice)}; run twice {n(self.run_twice)}; "
                f"overlapping runs {n(self.overlapped)}; lost {n(self.lost)}; stuck {n(self.stuck)}; "
                f"retried after a run stopped or lost unfinished {n(self.retried_after_loss)}; "
                f"re-run after a declared node loss {n(self.rerun_after_declared_loss)} "
                f"(completed again {n(self.completed_again_after_declared_loss)})")


def read_runs(lines: list[str]) -> dict[int, list[Run]]:
    """Job -> its runs, in the order they started."""
    runs: dict[tuple[int, str, int], Run] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 6:
            continue  # (a torn line cannot happen with one O_APPEND write; a foreign one is ignored)
        event, job, attempt, node, pid, at = parts
        key = (int(job), node, int(pid))
        if event == "start":
            runs[key] = Run(int(job), attempt, node, int(pid), float(at))
        elif event == "end" and key in runs:
            runs[key].ended = float(at)
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in runs.values():
        by_job[run.job].append(run)
    return {job: sorted(found, key=lambda run: run.started) for job, found in by_job.items()}


def count(job_ids: list[int], lines: list[str], states: dict[int, str], final: set[str],
          lost_attempts: set[tuple[int, str]] = frozenset()) -> Counts:
    """The soak's counts for ``job_ids`` (every soak job exits 0 once it has run to its end).

    ``states``: each job's state at the deadline; ``final`` the states that end a job;
    ``lost_attempts``: (job, attempt) pairs requeued because their node was declared lost."""
    runs = read_runs(lines)
    counts = Counts(jobs=len(job_ids))
    for job in job_ids:
        mine = runs.get(job, [])
        counts.runs_started += len(mine)
        completed = [run for run in mine if run.ended is not None]
        counts.runs_completed += len(completed)
        for index, run in enumerate(mine[1:], 1):
            earlier = mine[:index]
            if any(e.ended is not None and e.ended > run.started for e in earlier):
                counts.overlapped.append(job)  # (two live at once; a killed run that overlapped shows in the flocks)
                continue
            done_before = [e for e in earlier if e.ended is not None and e.ended <= run.started]
            if not done_before:
                counts.retried_after_loss.append(job)
            elif all((job, e.attempt) in lost_attempts for e in done_before):
                counts.rerun_after_declared_loss.append(job)
            else:
                counts.run_twice.append(job)
        if len(completed) > 1:
            explained = job in counts.rerun_after_declared_loss and job not in counts.run_twice
            (counts.completed_again_after_declared_loss if explained else counts.completed_twice).append(job)
        state = states.get(job)
        if state not in final:
            counts.stuck.append(job)
        elif state != "SUCCEEDED" or not completed:
            counts.lost.append(job)  # dropped, or its reported end is not the run's real one
    for name in ("run_twice", "overlapped", "retried_after_loss", "rerun_after_declared_loss"):
        setattr(counts, name, sorted(set(getattr(counts, name))))
    return counts


def ledger_lines(directory: Path) -> list[str]:
    path = directory / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


def completed_jobs(directory: Path) -> int:
    """How many distinct jobs have a run that reached its end (what a soak's progress is)."""
    return len({line.split()[1] for line in ledger_lines(directory) if line.startswith("end ")})
