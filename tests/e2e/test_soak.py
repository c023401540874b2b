"""Soak of the real stack under load (issue 35): with one CPU hog per core, a Celery worker with
beat, the ingest reader and three simulated agents run seeded soak jobs while fault rounds
SIGKILL an agent, the worker, the ingest reader and Redis and XTRIM the command and event
streams, and pause rounds freeze two agents (SIGSTOP, then SIGCONT). Each job appends to a
ledger when it starts and when it ends (:mod:`tests.e2e.soak_ledger`); at the end the ledger and
the database give the counts the issue holds to 0: jobs completed twice, run twice (started again
after a run of it had completed), lost, stuck.

A pause is shorter than the node-loss grace the stack runs with (pause + 30 s), as the issue's
60 s pause is against production's 10 s heartbeat and 60 s grace. A pause past the grace
(``SOAK_GRACE_S``) is a node loss: the control plane requeues the paused nodes' jobs, and a job
that completed unseen during the pause runs again elsewhere; the counts keep those re-runs apart.

The size comes from the environment (``bench/soak.py`` sets it): ``SOAK_JOBS`` (30),
``SOAK_FAULT_ROUNDS`` (1), ``SOAK_PAUSE_ROUNDS`` (1), ``SOAK_PAUSE_S`` (20), ``SOAK_SEED`` (35),
``SOAK_GRACE_S`` (0: pause + 30), ``SOAK_STALL_S`` (180);
``SOAK_REPORT`` names a JSON file for the figures. The seed fixes the jobs' lengths, the fault
order and which agents are killed and paused; the processes' timing is the machine's.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.e2e import soak_ledger
from tests.e2e.conftest import WORKER_ARGV, Processes, stack_environment, wait_for, wait_while_moving

AGENTS = {"e2e-node": "2xA100-80GB", "soak-a": "4xA100-80GB", "soak-b": "4xA100-80GB"}
FAULTS = ("agent", "worker", "ingest", "redis", "xtrim")


@dataclass(frozen=True)
class Plan:
    jobs: int = 30
    fault_rounds: int = 1
    pause_rounds: int = 1
    pause_s: float = 20.0
    seed: int = 35
    # The stack's node-loss grace; 0: the pause + 30 s (a pause is then no loss). One shorter than
    # the pause makes each pause a declared loss of the paused nodes.
    grace_s: float = 0.0
    # Seconds without a single job completing (or ending) before the soak gives up waiting: it
    # waits on progress, not on a deadline an idle machine would meet.
    stall_s: float = 180.0

    @classmethod
    def from_env(cls) -> "Plan":
        def get(name, kind, default):
            value = os.environ.get(f"SOAK_{name.upper()}")
            return kind(value) if value else default

        return cls(**{name: get(name, type(value), value) for name, value in asdict(cls()).items()})

    @property
    def node_lost_grace_s(self) -> int:
        return int(self.grace_s or self.pause_s + 30)

    def command(self) -> str:
        return (f".venv/bin/python bench/soak.py --jobs {self.jobs} --fault-rounds {self.fault_rounds} "
                f"--pause-rounds {self.pause_rounds} --pause-s {self.pause_s:g} --seed {self.seed}"
                + (f" --grace-s {self.grace_s:g}" if self.grace_s else ""))


PLAN = Plan.from_env()


# ---------------------------------------------------------------- the counts, on made-up ledgers


def _lines(*runs):
    """Ledger lines for (job, attempt, node, pid, start, end or None) tuples."""
    out = []
    for job, attempt, node, pid, start, end in runs:
        out.append(f"start {job} {attempt} {node} {pid} {start}")
        if end is not None:
            out.append(f"end {job} {attempt} {node} {pid} {end}")
    return out


FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}


def test_a_start_after_a_completed_run_counts_as_run_twice_and_after_a_killed_one_as_a_retry():
    lines = _lines((1, "1", "a", 10, 0.0, 1.0), (1, "2", "b", 11, 5.0, 6.0),  # ran again after completing
                   (2, "1", "a", 12, 0.0, None), (2, "2", "b", 13, 5.0, 6.0),  # first run killed
                   (3, "1", "a", 14, 0.0, 1.0))
    counts = soak_ledger.count([1, 2, 3], lines, {1: "SUCCEEDED", 2: "SUCCEEDED", 3: "SUCCEEDED"}, FINAL)
    assert (counts.completed_twice, counts.run_twice, counts.retried_after_loss) == ([1], [1], [2])
    assert (counts.lost, counts.stuck, counts.overlapped) == ([], [], [])


def test_a_rerun_after_a_declared_node_loss_is_kept_apart_and_overlaps_lost_and_stuck_jobs_count():
    lines = _lines((1, "1", "a", 10, 0.0, 1.0), (1, "2", "b", 11, 5.0, 6.0),
                   (2, "1", "a", 12, 0.0, 3.0), (2, "2", "b", 13, 1.0, 2.0),  # two live runs at once
                   (3, "1", "a", 14, 0.0, None))  # SUCCEEDED, though its run never reached its end
    counts = soak_ledger.count([1, 2, 3, 4], lines, {1: "SUCCEEDED", 2: "SUCCEEDED", 3: "SUCCEEDED", 4: "PLACED"},
                               FINAL, lost_attempts={(1, "1")})
    assert (counts.rerun_after_declared_loss, counts.run_twice, counts.overlapped) == ([1], [], [2])
    assert (counts.completed_again_after_declared_loss, counts.completed_twice) == ([1], [2])
    assert (counts.lost, counts.stuck) == ([3], [4])


# ---------------------------------------------------------------- the real stack under load


@pytest.fixture
def cpu_hogs():
    """One busy loop per core (nice 0, as the stack), for the test's whole length."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(len(os.sched_getaffinity(0)))]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.fixture
def soak_stack(transactional_db, live_redis, redis_server, tmp_path, request, settings, cpu_hogs):
    from monitoring.models import Node

    env = stack_environment(live_redis, tmp_path, COLONY_NODE_LOST_GRACE_S=str(PLAN.node_lost_grace_s))
    settings.COLONY_AGENT_SECRET, settings.COLONY_AGENT_AUTH = env["COLONY_AGENT_SECRET"], "required"
    processes = Processes(env, tmp_path)
    processes.start("worker", [*WORKER_ARGV, "-s", str(tmp_path / "beat-schedule")])
    processes.start("ingest", [sys.executable, "manage.py", "ingest", "--block-ms", "200", "--hold-s", "2"])
    for node, spec in AGENTS.items():
        processes.start_agent(node, spec)
    soak = Soak(processes, redis_server, tmp_path / "soak", PLAN, cpu_hogs)
    try:
        wait_for(lambda: Node.objects.count() >= len(AGENTS), timeout=120, what="the agents' registration")
        yield soak
    except BaseException:
        print(processes.logs())
        raise
    finally:
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(processes.logs())
        soak.resume_all()
        if not redis_server.ping():
            redis_server.start()  # (session-wide: the next test needs it)
        processes.stop_all()


class Soak:
    """The faults a soak applies to its stack, and its progress."""

    def __init__(self, processes: Processes, redis_server, out: Path, plan: Plan, hogs):
        self.processes, self.redis_server, self.out, self.plan, self.hogs = processes, redis_server, out, plan, hogs
        self.rng = random.Random(plan.seed)
        self.paused: list = []
        self.faults: list[tuple[str, int]] = []
        self.cpu_of_killed = 0.0
        self.clients: list = []
        self.job_ids: list[int] = []
        out.mkdir()
        out.chmod(0o777)  # jobs may run under another uid

    def submit(self, count: int) -> list[int]:
        """Submit ``count`` soak jobs (one GPU, 1-4 s each, the tenants in turn); their ids."""
        if not self.clients:
            self.clients = _tenant_clients()
        ids = []
        for _ in range(count):
            run_s = round(self.rng.uniform(1.0, 4.0), 2)
            response = self.clients[len(self.job_ids) % 2].post("/api/v1/jobs/", {
                "name": f"soak-{len(self.job_ids)}", "gpus": 1,
                "command": [sys.executable, "-c", soak_ledger.JOB_SCRIPT, str(self.out), str(run_s)],
            }, format="json")
            assert response.status_code == 201, response.content
            self.job_ids.append(response.json()["id"])
            ids.append(self.job_ids[-1])
        return ids

    def wait_placed(self, ids: list[int]) -> None:
        """Until one of ``ids`` has left the queue (a fault then meets a launch in flight)."""
        from jobs.models import Job

        if ids:
            self.wait_progress(lambda: int(Job.objects.filter(pk__in=ids).exclude(state="PENDING").exists()), 1,
                               f"a placement of jobs {ids}")

    def live(self, name: str) -> subprocess.Popen:
        return next(p for n, p in reversed(self.processes.started) if n == name and p.poll() is None)

    def completed(self) -> int:
        return soak_ledger.completed_jobs(self.out)

    def _kill(self, name: str) -> list[str]:
        process = self.live(name)
        self.cpu_of_killed += _cpu(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        return process.args

    def apply(self, fault: str) -> None:
        self.faults.append((fault, self.completed()))
        if fault == "agent":
            node = self.rng.choice(sorted(AGENTS))
            self.faults[-1] = (f"agent {node} SIGKILL", self.faults[-1][1])
            self._kill(f"agent-{node}")
            time.sleep(1.0)
            self.processes.start_agent(node, AGENTS[node])
        elif fault in ("worker", "ingest"):
            self.processes.start(fault, self._kill(fault))
            self.faults[-1] = (f"{fault} SIGKILL", self.faults[-1][1])
        elif fault == "redis":
            self.cpu_of_killed += _cpu(self.redis_server.process.pid)
            self.redis_server.process.kill()
            self.redis_server.process.wait(30)
            time.sleep(2.0)
            self.redis_server.start(timeout=60)
            self.faults[-1] = ("Redis SIGKILL (restarts empty)", self.faults[-1][1])
        elif fault == "xtrim":
            import redis

            from agents import protocol

            client = redis.Redis.from_url(self.redis_server.url)
            streams = [protocol.EVENTS_STREAM]
            for node in AGENTS:
                streams += [protocol.command_stream(node), protocol.node_events_stream(node)]
            trimmed = sum(client.xtrim(stream, maxlen=0) for stream in streams)
            client.close()
            self.faults[-1] = (f"XTRIM commands and events ({trimmed} entries)", self.faults[-1][1])

    def pause(self, nodes: list[str], then) -> None:
        """SIGSTOP the agents of ``nodes`` (their running jobs go on under their supervisors),
        call ``then`` half-way through, SIGCONT them at the end."""
        self.faults.append((f"agents {', '.join(nodes)} SIGSTOP {self.plan.pause_s:g}s", self.completed()))
        self.paused = [self.live(f"agent-{node}") for node in nodes]
        for process in self.paused:
            os.killpg(process.pid, signal.SIGSTOP)
        time.sleep(self.plan.pause_s / 2)
        then()
        time.sleep(self.plan.pause_s / 2)
        self.resume_all()

    def resume_all(self) -> None:
        for process in self.paused:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
        self.paused = []

    def wait_progress(self, measure, target: int, what: str) -> bool:
        """Wait until ``measure()`` reaches ``target``, as long as it keeps moving: False once it
        has not moved for the plan's ``stall_s`` (the counts then say what is stuck)."""
        try:
            wait_while_moving(measure, target, stall_s=self.plan.stall_s, what=what)
            return True
        except AssertionError as stalled:
            print(f"soak: {stalled}")
            return False

    def stack_cpu(self) -> float:
        """CPU seconds of the stack's processes (worker, ingest, agents, Redis), killed ones included."""
        return self.cpu_of_killed + _cpu(self.redis_server.process.pid) + sum(
            _cpu(p.pid) for _, p in self.processes.started if p.poll() is None)


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal shares, the larger first."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def _tenant_clients():
    from rest_framework.test import APIClient

    from tests.factories import MembershipFactory, TenantFactory, UserFactory

    clients = []
    for slug in ("vision", "nlp"):
        user = MembershipFactory(user=UserFactory(username=f"{slug}-user"),
                                 tenant=TenantFactory(slug=slug, guaranteed_gpus=5, max_gpus=10)).user
        client = APIClient()
        client.force_authenticate(user)
        clients.append(client)
    return clients


@pytest.mark.e2e
def test_under_load_faults_and_pauses_no_job_runs_twice_is_lost_or_stuck(soak_stack):
    from jobs.choices import TERMINAL_STATES, JobEventKind
    from jobs.models import Job, JobEvent
    from jobs.services import lifecycle

    soak, plan = soak_stack, soak_stack.plan
    wall0, self0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    hog0 = sum(_cpu(h.pid) for h in soak.hogs)
    rounds = ["faults"] * plan.fault_rounds + ["pause"] * plan.pause_rounds
    soak.rng.shuffle(rounds)
    # The jobs come in slices, one before each fault and two in each pause (at its start and
    # half-way), so that every fault lands on launches and runs in flight, not on an idle stack.
    slices = _split(plan.jobs, 1 + sum(len(FAULTS) if kind == "faults" else 2 for kind in rounds))
    soak.submit(slices.pop(0))
    for kind in rounds:
        if kind == "pause":
            soak.wait_placed(soak.submit(slices.pop(0)))
            soak.pause(soak.rng.sample(sorted(AGENTS), 2), then=lambda: soak.submit(slices.pop(0)))
        else:
            for fault in soak.rng.sample(FAULTS, len(FAULTS)):
                soak.wait_placed(soak.submit(slices.pop(0)))
                soak.apply(fault)
        # One more completion (of those submitted) before the next round: each lands on a stack
        # that recovered.
        soak.wait_progress(soak.completed, min(soak.completed() + 1, len(soak.job_ids)),
                           f"progress after {soak.faults[-1][0]}")
    job_ids = soak.job_ids

    def ended() -> int:
        return Job.objects.filter(pk__in=job_ids, state__in=TERMINAL_STATES).count()

    soak.wait_progress(ended, plan.jobs, "every job to end")
    states = dict(Job.objects.filter(pk__in=job_ids).values_list("id", "state"))
    lost_attempts = {(job, str(attempt)) for job, attempt in JobEvent.objects.filter(
        job_id__in=job_ids, kind=JobEventKind.REQUEUED, message__contains="stopped responding",
    ).values_list("job_id", "attempt")}
    counts = soak_ledger.count(job_ids, soak_ledger.ledger_lines(soak.out), states, set(TERMINAL_STATES),
                               lost_attempts)
    violations_path = soak.out / "violations.txt"
    flock_violations = violations_path.read_text().splitlines() if violations_path.exists() else []
    requeues = sum(Job.objects.filter(pk__in=job_ids).values_list("requeue_count", flat=True))
    import redis

    client = redis.Redis.from_url(soak.redis_server.url)
    ignored = int(client.get(lifecycle.IGNORED_REPORTS_KEY) or 0)
    client.close()
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    figures = {
        "plan": asdict(plan), "node_lost_grace_s": plan.node_lost_grace_s, "command": plan.command(),
        "faults": soak.faults, "counts": asdict(counts),
        "flock_violations": flock_violations, "requeues": requeues, "stale_reports_ignored": ignored,
        "wall_s": round(time.monotonic() - wall0, 1),
        "cpu_s": {"stack": round(soak.stack_cpu(), 1),
                  "test_process": round(self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime, 1),
                  "hogs": round(sum(_cpu(h.pid) for h in soak.hogs) - hog0, 1)},
        "load_average": os.getloadavg(),
    }
    print(f"\nsoak: {counts.summary()}")
    print(f"soak: faults at completions {soak.faults}; requeues {requeues}; stale reports ignored {ignored}; "
          f"flock violations {len(flock_violations)}")
    print(f"soak: wall {figures['wall_s']}s, CPU {figures['cpu_s']}, load {figures['load_average']}")
    print(f"soak: reproduce with: {plan.command()}")
    odd = sorted({job for jobs in [*counts.violations().values(), counts.retried_after_loss,
                                   counts.rerun_after_declared_loss] for job in jobs})
    for job in odd:  # what each odd job's runs and timeline were, to read the cause from
        runs = [line for line in soak_ledger.ledger_lines(soak.out) if line.split()[1] == str(job)]
        print(f"soak: job {job} ({states.get(job)}) runs:", *(f"\n    {line}" for line in runs))
        for attempt, kind, node, at, message in JobEvent.objects.filter(job_id=job).values_list(
                "attempt", "kind", "node", "at", "message"):
            print(f"    #{attempt} {at:%H:%M:%S.%f} {kind} {node}: {message}")
    if os.environ.get("SOAK_REPORT"):
        Path(os.environ["SOAK_REPORT"]).write_text(json.dumps(figures, indent=1))
    assert {name: jobs for name, jobs in counts.violations().items() if jobs} == {}, plan.command()
    assert flock_violations == [], plan.command()
