"""The full scheduling loop against a real database and Redis (not just the pure core).

    python bench/scheduling_loop.py --nodes 1024 --pending 50000 --running 1500 --tenants 100

Fills a throw-away database (PostgreSQL when one answers on 127.0.0.1:5432: ``$COLONY_BENCH_DB``,
else ``colony_bench_loop_<pid>``, dropped at exit, so runs beside it are left alone) with nodes, tenants,
running jobs with allocations and pending jobs, marks the nodes alive in a private Redis, then
runs ``run_scheduling_cycle()``:

- first cycle: a new scheduler process's (nothing kept from earlier snapshots), which places
  everything that fits (the placed jobs are then marked started, as their agents would report
  within seconds);
- steady cycles: nothing changed since the cycle before, which placed and preempted nothing
  (:func:`steady_next`); the loop still snapshots, decides and stores reasons. The cycle right
  after placements reads them (and the agents' starts) back: it is measured apart, as "after a
  change", never in the steady median;
- churn cycles: before each, ``--finish`` running jobs end, so a few placements, ETAs and
  reasons move (what a busy cluster sees every cycle);
- with ``--restart``, last: a restarted scheduler's first cycle. This process hands its lease
  back, as a warm shutdown does, and a new process (this script, ``--restarted-child``) runs one
  cycle on the same database and Redis, with nothing kept from this one's cycles; its CPU (the
  new process's cycle, its database backend, Redis; not its start-up imports) is measured there.
  ``--restarts N`` runs N such processes one after another and reports their median; with
  ``--phases`` and ``--statements`` each prints its stages and slowest statements.

``--phases`` splits each cycle's CPU by stage; ``BENCH_STAGES=module:function,...`` (for example
``jobs.services.apply:_queue``) times module-level functions within the stages the same way.
``--profile`` profiles whole cycles (cProfile); ``PROFILE_OUT=FILE`` keeps each profile for
``pstats`` (callers, callees).

With ``--grow-to N`` the queue then grows to N pending jobs in the same process (same cluster,
same machine, minutes apart) and, once the loop has settled, the steady and the churn cycles are
measured again: their cost against the queue's length, as ratios from one run.

With ``--samples`` every node also publishes a live sample before each cycle, as its agent would:
the snapshot then reads 1,024 samples, the core packs by live use (jobs use less than they
asked, so more fit) and AIMD moves duty cycles every cycle. Cycles after the first run unmeasured
until packing stops (``--settle``); AIMD never stops probing, so about a tenth of the
opportunistic jobs change duty cycle in every steady cycle. Without it no node has a reading.

Every phase is measured in CPU seconds (this process's ``process_time``, the PostgreSQL backend's
and Redis's utime+stime from ``/proc``) beside wall time, because wall time moves several-fold
between identical runs on a shared machine. The baseline of each kind of cycle, measured in the
same process right after each cycle of that kind, is the pure core, ``decide()``, fresh (without
the loop's carry) on the very snapshot, ``now`` and config that cycle decided on: first cycle vs
the room snapshot's decide, steady vs steady, churn vs churn. The ratios say what the database,
Redis and the rest of the loop cost beyond deciding afresh.
Rows updated in ``jobs_job``, verdict rows written (``JobWait``) and queries per cycle are counted
too. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import gc
import random
import statistics
from collections import Counter
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import backend_pid, proc_cpu, setup  # noqa: E402

GPUS_PER_NODE = 8
DATABASE = "colony_bench_loop"


@dataclass
class Sample:
    wall: float
    python: float
    database: float
    redis: float
    queries: int = 0
    job_rows_updated: int = 0
    verdict_rows_written: int = 0

    @property
    def cpu(self) -> float:
        return self.python + self.database + self.redis


@dataclass
class Meter:
    """CPU seconds of this process, the database backend serving it and Redis around a call."""

    redis_pid: int | None
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    # Per phase, statements by their first words, and the wall seconds they took (``--statements``
    # prints the slowest kinds).
    statements: dict[str, Counter] = field(default_factory=dict)
    statement_s: dict[str, Counter] = field(default_factory=dict)
    phases: "PhaseClock | None" = None
    # CPU seconds of this process's garbage collector by the phase measured last before it ran: a
    # cycle's garbage is often collected after it returns (between cycles, in whatever allocates
    # next), and that is still the cycle's cost.
    collector: Counter = field(default_factory=Counter)
    _collecting: list = field(default_factory=list)
    _last: str = "setup"

    def watch_collector(self) -> None:
        def on_collection(phase: str, info: dict) -> None:
            if phase == "start":
                self._collecting.append(time.process_time())
            elif self._collecting:
                self.collector[self._last] += time.process_time() - self._collecting.pop()
        gc.callbacks.append(on_collection)

    def collector_per_run(self, name: str) -> float:
        return self.collector[name] / max(1, len(self.samples.get(name, ())))

    def measure(self, name: str, fn):
        from django.db import connection

        self._last = name
        counts = {"queries": 0, "rows": 0, "verdicts": 0}
        if self.phases:
            self.phases.current = name
        kinds = self.statements.setdefault(name, Counter())
        seconds = self.statement_s.setdefault(name, Counter())

        def count(execute, sql, params, many, context):
            began = time.perf_counter()
            result = execute(sql, params, many, context)
            kind = " ".join(sql.split()[:4])[:70]
            seconds[kind] += time.perf_counter() - began
            counts["queries"] += 1
            kinds[kind] += 1
            if sql.lstrip().upper().startswith("UPDATE") and '"jobs_job"' in sql.split("SET", 1)[0]:
                counts["rows"] += max(context["cursor"].rowcount, 0)
            elif '"jobs_jobwait"' in sql and sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
                counts["verdicts"] += max(context["cursor"].rowcount, 0)
            return result

        backend = backend_pid()
        before = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(self.redis_pid))
        with connection.execute_wrapper(count):
            result = fn()
        after = (time.perf_counter(), time.process_time(), proc_cpu(backend), proc_cpu(self.redis_pid))
        if backend != backend_pid():
            print(f"  (warning: the database connection changed during {name}; its CPU is not counted)")
        self.samples.setdefault(name, []).append(Sample(
            *(b - a for a, b in zip(before, after)), queries=counts["queries"], job_rows_updated=counts["rows"],
            verdict_rows_written=counts["verdicts"]))
        return result

    def median(self, name: str) -> Sample:
        runs = self.samples[name]
        return Sample(*(statistics.median(getattr(s, f) for s in runs)
                        for f in ("wall", "python", "database", "redis", "queries", "job_rows_updated",
                                  "verdict_rows_written")))


def steady_next(previous, changed_since: int) -> bool:
    """Whether the next cycle is a steady one, a cycle where nothing changed: the cycle before it
    (``previous``, a ``CycleResult``; None for none) placed and preempted nothing, and nothing
    happened since (``changed_since``: jobs the agents started, jobs that ended, submissions).
    The cycle right after placements is not steady even when no job arrives: it reads back the
    rows the placements and the agents' starts wrote. With live samples AIMD's duty-cycle moves
    go on in every cycle (they are what a steady cycle with samples is)."""
    return previous is not None and not previous.placed and not previous.preempted and not changed_since


class LoopDecide:
    """Keeps what the loop's last cycle decided on (``decide``'s arguments: its snapshot, ``now``,
    config), so that the baseline decides afresh, without the carry, on exactly that."""

    def __init__(self):
        self.decide = None
        self.last: dict | None = None

    def install(self) -> None:
        import inspect

        from jobs.services import scheduling_loop

        self.decide = decide = scheduling_loop.decide
        signature = inspect.signature(decide)

        def recording(*args, **kwargs):
            self.last = dict(signature.bind(*args, **kwargs).arguments)
            return decide(*args, **kwargs)

        scheduling_loop.decide = recording

    def fresh(self):
        """``decide()`` again on the last cycle's inputs, with no carry (a restarted scheduler's)."""
        return self.decide(**{**self.last, "carry": None})


class PhaseClock:
    """CPU seconds (this process + the database backend) of each stage of ``run_scheduling_cycle``,
    by wrapping the functions it calls; the cycle kind is the phase ``Meter.measure`` runs."""

    STAGES = ("advance_usage", "build_snapshot", "decide", "apply_decisions", "resend_unstarted_launches",
              "resend_stops")

    def __init__(self):
        self.current = "setup"
        self.spent: dict[str, dict[str, list[float]]] = {}

    def install(self) -> None:
        import importlib

        from jobs.services import scheduling_loop

        for stage in self.STAGES:
            setattr(scheduling_loop, stage, self._wrap(stage, getattr(scheduling_loop, stage)))
        # ``BENCH_STAGES=jobs.services.apply:_queue,...``: module-level functions within the stages,
        # timed the same way (a function called by its module-global name).
        for spec in filter(None, os.environ.get("BENCH_STAGES", "").split(",")):
            module_name, _, name = spec.partition(":")
            module = importlib.import_module(module_name)
            setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            backend = backend_pid()
            before = time.process_time() + proc_cpu(backend)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() + proc_cpu(backend) - before
                self.spent.setdefault(self.current, {}).setdefault(stage, []).append(spent)
        return timed

    def print(self) -> None:
        print("  stages (median CPU s, Python + DB backend):")
        for kind, stages in self.spent.items():
            if kind in ("decide", "snapshot", "setup"):
                continue
            print(f"    {kind:12s} " + "  ".join(f"{stage} {statistics.median(v):.3f}" for stage, v in stages.items()))


def populate(rng: random.Random, nodes: int, tenants: int, running: int, pending: int) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.choices import RunClass, JobState
    from jobs.models import Allocation, Job, Tenant
    from monitoring.models import Gpu, Node

    now = timezone.now()
    node_rows = Node.objects.bulk_create([Node(name=f"node{i:04d}", registered_at=now, rack=f"rack{i // 32}")
                                          for i in range(nodes)])
    gpus = Gpu.objects.bulk_create([
        Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="A100-80GB", memory_mib=81920)
        for node in node_rows for i in range(GPUS_PER_NODE)
    ])
    total = len(gpus)
    tenant_rows = Tenant.objects.bulk_create([
        Tenant(slug=f"t{i:03d}", name=f"Tenant {i}", guaranteed_gpus=int(0.7 * total / tenants),
               max_gpus=int(1.5 * total / tenants), weight=rng.choice([1.0, 1.0, 2.0]))
        for i in range(tenants)
    ])
    owner = get_user_model().objects.create_user("bench")
    running_jobs = Job.objects.bulk_create([
        Job(tenant=rng.choice(tenant_rows), owner=owner, name=f"r{i}", command=["true"], gpus=1,
            state=JobState.RUNNING, run_class=RunClass.GUARANTEED, gpu_memory_mib=20000, placed_at=now,
            started_at=now, max_runtime_s=rng.choice([None, 3600, 7200]))
        for i in range(min(running, total))
    ])
    Allocation.objects.bulk_create([Allocation(job=job, gpu=gpu) for job, gpu in zip(running_jobs, gpus)])
    add_pending(rng, pending)


def add_pending(rng: random.Random, count: int) -> None:
    """``count`` more pending jobs of the tenants there are, submitted now."""
    from django.contrib.auth import get_user_model

    from jobs.models import Job, Tenant

    tenant_rows, owner = list(Tenant.objects.order_by("id")), get_user_model().objects.get(username="bench")
    first = Job.objects.count()
    shapes = [(1, 1000), (1, 500), (1, 250), (2, 1000), (4, 1000), (8, 1000)]
    for start in range(0, count, 10_000):  # (a batch at a time: 200,000 Job objects at once are gigabytes)
        Job.objects.bulk_create([
            Job(tenant=rng.choice(tenant_rows), owner=owner, name=f"p{first + i}", command=["true"],
                gpus=(shape := rng.choice(shapes))[0], gpu_milli=shape[1],
                gpu_memory_mib=rng.choice([8000, 16000, 30000]), priority=rng.randint(-2, 2),
                max_runtime_s=rng.choice([None, 3600, 7200]))
            for i in range(start, min(count, start + 10_000))
        ], batch_size=2000)


def node_samples(rng: random.Random, nodes: int, seq: int) -> list:
    """What each node's agent last sent: its GPUs' and its jobs' utilisation and memory. A job
    keeps a utilisation of its own (by its id) that moves a few points from one sample to the
    next, scaled by its duty cycle; a GPU's is the sum of its jobs'."""
    from agents.protocol import GpuSample, JobGpuSample, NodeSample
    from jobs.models import Allocation

    by_node: dict[str, list[tuple[int, int, int | None]]] = {}
    for job_id, node, index, memory, duty in Allocation.objects.filter(released_at__isnull=True).values_list(
            "job_id", "gpu__node__name", "gpu__index", "job__gpu_memory_mib", "duty_cycle"):
        by_node.setdefault(node, []).append((job_id, index, memory, duty))
    now, samples = time.time(), []
    for i in range(nodes):
        name = f"node{i:04d}"
        jobs, busy = [], {}
        for job_id, index, memory, duty in by_node.get(name, []):
            # (its own level, times the share of time its duty cycle lets it run)
            util = min(100.0, max(0.0, (20 + (job_id * 37) % 80 + rng.uniform(-3, 3)) * duty))
            used = int((memory or 20000) * 0.9)
            jobs.append(JobGpuSample(job_id=job_id, gpu_index=index, mem_used_mib=used, util_sm=round(util, 1)))
            load, held = busy.get(index, (0.0, 0))
            busy[index] = (min(100.0, load + util), held + used)
        gpus = [GpuSample(index=index, util_sm=round(busy.get(index, (0.0, 0))[0], 1),
                          mem_used_mib=busy.get(index, (0.0, 0))[1] or 300, mem_total_mib=81920)
                for index in range(GPUS_PER_NODE)]
        samples.append(NodeSample(node=name, ts=now, seq=seq, gpus=gpus, jobs=jobs,
                                  running_jobs=sorted({job.job_id for job in jobs})))
    return samples


def agents_start_placed() -> int:
    """What the agents would report within seconds: every placed job started."""
    from django.utils import timezone

    from jobs.choices import JobState
    from jobs.models import Job

    return Job.objects.filter(state=JobState.PLACED).update(state=JobState.RUNNING, started_at=timezone.now())


def finish_some(rng: random.Random, count: int) -> None:
    """``count`` running jobs end (their GPUs freed), as if their exits had just been consumed."""
    from django.utils import timezone

    from jobs.choices import JobState
    from jobs.models import Allocation, Job

    ids = list(Job.objects.filter(state=JobState.RUNNING).order_by("id").values_list("id", flat=True))
    ended = rng.sample(ids, min(count, len(ids)))
    now = timezone.now()
    Allocation.objects.filter(job_id__in=ended, released_at__isnull=True).update(released_at=now)
    Job.objects.filter(pk__in=ended).update(state=JobState.SUCCEEDED, finished_at=now, exit_code=0)


def restarted(redis_server, profile: bool = False, phases: bool = False, statements: bool = False) -> Sample:
    """Hand the lease back (a warm shutdown's) and measure one cycle of a new scheduler process
    (``profile``: and print where its time went, cProfile's top functions; ``phases``: its stages)."""
    import json
    import subprocess

    from django.db import connection

    from jobs.services.scheduling_loop import hand_back_on_shutdown

    hand_back_on_shutdown()
    connection.close()  # (no transaction of this process's left open beside the new one's)
    redis_pid = getattr(getattr(redis_server, "process", None), "pid", None) or 0
    done = subprocess.run([sys.executable, __file__, "--restarted-child", str(redis_pid)]
                          + (["--profile"] if profile else []) + (["--phases"] if phases else [])
                          + (["--statements"] if statements else []), capture_output=True, text=True, check=True)
    if profile or phases or statements:
        print(done.stderr, end="")
    return Sample(**json.loads(done.stdout.strip().splitlines()[-1]))


def restarted_child(redis_pid: int, profile: bool, phases: bool, statements: bool) -> None:
    """In the new process: the environment this bench set up (database, Redis, settings) is
    inherited; imports and the database connection are made before the clock starts."""
    import dataclasses
    import json

    import django

    django.setup()
    from django.db import connection

    from jobs.services.scheduling_loop import hand_back_on_shutdown, run_scheduling_cycle

    connection.ensure_connection()
    gc.collect()
    clock = PhaseClock() if phases else None
    if clock:
        clock.install()
    meter = Meter(redis_pid=redis_pid or None, phases=clock)
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        result = meter.measure("restarted", lambda: profiler.runcall(run_scheduling_cycle))
        print("--- profile of a restarted scheduler's first cycle (own time; its CPU figure is the profiled one)",
              file=sys.stderr)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
        stats.print_stats(int(os.environ.get("PROFILE_LINES", "25")))
        if os.environ.get("PROFILE_OUT"):  # (for pstats' callers and callees)
            stats.dump_stats(os.environ["PROFILE_OUT"])
    else:
        result = meter.measure("restarted", run_scheduling_cycle)
    if clock:
        sys.stdout, stdout = sys.stderr, sys.stdout
        try:
            clock.print()
        finally:
            sys.stdout = stdout
    if statements:
        kinds, seconds = meter.statements["restarted"], meter.statement_s["restarted"]
        print("  restarted (slowest first): " + "; ".join(
            f"{kinds[kind]} x {kind} {spent:.3f} s" for kind, spent in seconds.most_common(8)), file=sys.stderr)
    hand_back_on_shutdown()
    if not result.ran or result.fenced:
        sys.exit(f"the new process's cycle did not run to the end: {result}")
    print(json.dumps(dataclasses.asdict(meter.samples["restarted"][0])))


def row(label: str, sample: Sample, baseline: tuple[str, Sample] | None = None, extra: str = "") -> str:
    """``baseline``: (its name, its median), the fresh ``decide()`` on the same kind of snapshot."""
    ratio = f"x{sample.cpu / baseline[1].cpu:5.1f} decide({baseline[0]})" if baseline else ""
    return (f"  {label:<32}: CPU {sample.cpu:6.3f} s (Python {sample.python:6.3f} + DB {sample.database:6.3f} "
            f"+ Redis {sample.redis:5.3f}) {ratio:<22} | wall {sample.wall:6.3f} s | "
            f"{sample.queries:5.0f} queries, {sample.job_rows_updated:6.0f} job rows updated, "
            f"{sample.verdict_rows_written:6.0f} verdicts written{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--running", type=int, default=1500)
    parser.add_argument("--pending", type=int, default=50_000)
    parser.add_argument("--finish", type=int, default=8, help="running jobs that end before each churn cycle")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    parser.add_argument("--statements", action="store_true", help="print each phase's commonest statements")
    parser.add_argument("--phases", action="store_true",
                        help="split each cycle's CPU (Python + database backend) by stage: usage, snapshot, "
                             "decide, apply, resends")
    parser.add_argument("--save-snapshots", metavar="FILE",
                        help="after the measurements, pickle a steady and a churn snapshot as the loop saw them, "
                             "for bench/decide_snapshot.py")
    parser.add_argument("--samples", action="store_true",
                        help="every node also publishes a live sample before each cycle, as its agent would "
                             "(each GPU's and each job's utilisation and memory, moving a little from cycle "
                             "to cycle): the snapshot reads them and the core throttles by them")
    parser.add_argument("--settle", type=int, default=20,
                        help="with --samples: unmeasured cycles after the first, until one places nothing and "
                             "throttles at most 1%% of --running")
    parser.add_argument("--grow-to", type=int, default=0, metavar="PENDING",
                        help="after the measurements, submit jobs until this many are pending, let the loop "
                             "settle and measure steady cycles again, in the same process: the steady cycle's "
                             "cost against the queue's length, on one machine in one run")
    parser.add_argument("--restart", action="store_true",
                        help="after the measurements, a restarted scheduler's first cycle: a new process takes "
                             "the lease over and runs one cycle on the same database (see above)")
    parser.add_argument("--restarts", type=int, default=1, metavar="N",
                        help="with --restart: that many new processes one after another (their median)")
    parser.add_argument("--restarted-child", metavar="REDIS_PID", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true",
                        help="after the measurements, profile one steady and one churn cycle (cProfile, top functions)")
    args = parser.parse_args()
    if args.restarted_child is not None:
        return restarted_child(args.restarted_child, args.profile, args.phases, args.statements)

    db_label, redis_server = setup(args.database, DATABASE)
    import redis

    from agents.protocol import heartbeat_key
    from jobs.services.scheduler_config import scheduler_config
    from jobs.services.scheduling_loop import run_scheduling_cycle
    from jobs.services import snapshot_loader
    from jobs.services.snapshot_loader import build_snapshot
    from monitoring.services import live
    from monitoring.services.health import MAX_HEARTBEAT_TTL_S

    rng = random.Random(7)
    populate(rng, args.nodes, args.tenants, args.running, args.pending)
    from django.db import connection

    if connection.vendor == "postgresql":
        # As autovacuum would within a minute of the load: plans need row counts (a table never
        # analysed once made the planner scan all 50,000 job rows for a handful).
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    client = redis.Redis.from_url(redis_server.url)

    samples_seq, samples_rng = iter(range(1, 10**9)), random.Random(11)  # (its own: the jobs that end stay those)

    def heartbeats():
        # The agents' part (a heartbeat lives at most MAX_HEARTBEAT_TTL_S), outside the measurements,
        # the collector paused: its objects, collected here, would be charged to the cycle before.
        collecting = gc.isenabled()
        gc.disable()
        try:
            pipe = client.pipeline(transaction=False)
            for i in range(args.nodes):
                pipe.set(heartbeat_key(f"node{i:04d}"), "{}", ex=MAX_HEARTBEAT_TTL_S)
            pipe.execute()
            if args.samples:
                live.store_latest(client, node_samples(samples_rng, args.nodes, next(samples_seq)))
        finally:
            if collecting:
                gc.enable()

    heartbeats()
    loop_decide = LoopDecide()
    loop_decide.install()
    phases = PhaseClock() if args.phases else None
    if phases:
        phases.install()
    meter = Meter(redis_pid=getattr(getattr(redis_server, "process", None), "pid", None), phases=phases)

    def decide_afresh(kind: str) -> None:
        """The baseline: the pure core, fresh, on what the cycle just measured decided on."""
        meter.measure(f"decide {kind}", loop_decide.fresh)
        loop_decide.last = None
        meter._last = "baseline"
        gc.collect()  # (the baseline's garbage is not the next cycle's)

    def snapshot_without_gc():
        # As in the loop, which pauses the collector for the whole cycle.
        gc.disable()
        try:
            return build_snapshot(client)
        finally:
            gc.enable()

    for _ in range(args.repeat):
        meter.measure("snapshot", snapshot_without_gc)

    heartbeats()
    snapshot_loader.forget()  # (the first cycle is a new process's: nothing kept from the snapshots above)
    gc.collect()  # (what setting up left is not the cycles' garbage)
    meter.watch_collector()
    first = meter.measure("first", run_scheduling_cycle)
    room = loop_decide.last["snapshot"] if args.save_snapshots else None
    decide_afresh("room")
    started = changed = agents_start_placed()
    previous = first
    if args.samples:
        # Live readings open room where jobs use less than they asked: packing goes on for some
        # cycles after the first, and duty cycles move until AIMD settles. Steady means after that.
        settling, meter._last = [], "settling"  # (their garbage is not the first cycle's)
        if phases:
            phases.current = "settling"
        for _ in range(args.settle):
            heartbeats()
            previous = run_scheduling_cycle()
            changed = agents_start_placed()
            settling.append((previous.placed, previous.throttled))
            if not previous.placed and previous.throttled <= 0.01 * args.running:
                break
        print("  settling cycles with live samples (placed, throttled): " + ", ".join(map(str, settling)))
    # Steady cycles are those after one where nothing changed; the cycles after a change (the
    # first one's placements read back) are measured apart, at most a few before giving up.
    steady, after_change = [], []
    while len(steady) < args.repeat and len(after_change) < 5:
        heartbeats()
        kind = "steady" if steady_next(previous, changed) else "after change"
        previous = meter.measure(kind, run_scheduling_cycle)
        (steady if kind == "steady" else after_change).append(previous)
        if kind == "steady":
            decide_afresh("steady")
        changed = agents_start_placed()
    churn = []
    for _ in range(args.repeat):
        heartbeats()
        finish_some(rng, args.finish)
        churn.append(meter.measure("churn", run_scheduling_cycle))
        decide_afresh("churn")
        agents_start_placed()

    grown_pending = None
    if args.grow_to > args.pending:
        # The same cluster with a longer queue: submitted, then cycles until one places nothing
        # and nothing changed since (the reasons of 150,000 new jobs written first), then steady.
        meter._last = "growing"
        if phases:
            phases.current = "growing"
        add_pending(rng, args.grow_to - args.pending - sum(r.placed for r in churn))
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        previous, changed = None, 1
        for _ in range(8):
            if steady_next(previous, changed):
                break
            heartbeats()
            previous = run_scheduling_cycle()
            changed = agents_start_placed()
        for _ in range(args.repeat):
            heartbeats()
            if not steady_next(previous, changed):
                break
            previous = meter.measure("steady grown", run_scheduling_cycle)
            grown_pending = previous.pending
            changed = agents_start_placed()
        # The same k jobs ending against the longer queue: a cycle's cost should follow k, not it.
        grown_churn = []
        for _ in range(args.repeat if grown_pending else 0):
            heartbeats()
            finish_some(rng, args.finish)
            grown_churn.append(meter.measure("churn grown", run_scheduling_cycle))
            agents_start_placed()
        if args.profile and steady_next(previous, changed):
            import cProfile
            import pstats

            for kind in ("steady", "churn"):
                heartbeats()
                if kind == "churn":
                    finish_some(rng, args.finish)
                profiler = cProfile.Profile()
                profiler.runcall(run_scheduling_cycle)
                print(f"--- profile of one {kind} cycle at {args.grow_to:,} pending (own time)")
                stats = pstats.Stats(profiler)
                stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
                stats.print_stats(int(os.environ.get("PROFILE_LINES", "25")))
                if kind == "churn":
                    agents_start_placed()

    meter._last = "after"  # (what the report and the extras below allocate is not a cycle's)
    print(f"scheduling loop bench: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.tenants} tenants, "
          f"{args.running} running, {args.pending} pending, {db_label} + Redis; medians of {args.repeat} "
          f"(first cycle and room: 1); decide(X): the pure core, fresh (no carry), on the snapshot of the "
          f"cycles of kind X, right after each")
    baselines = {kind: meter.median(f"decide {kind}") for kind in ("room", "steady", "churn")
                 if f"decide {kind}" in meter.samples}
    for kind, label in (("room", "decide(room): first cycle's"), ("steady", "decide(steady): steady cycles'"),
                        ("churn", "decide(churn): churn cycles'")):
        if kind in baselines:
            print(row(label, baselines[kind]))
    print(row("snapshot from DB + Redis", meter.median("snapshot"), ("room", baselines["room"])))
    first_sample = meter.median("first")
    print(row("first full cycle", first_sample, ("room", baselines["room"]),
              f"; placed {first.placed} ({first.placed / first_sample.cpu:,.0f}/CPU s), "
              f"{first.pending} left pending, {started} started"))
    if after_change:
        print(row("cycle after placements (apart)", meter.median("after change"), None,
                  f"; {len(after_change)} cycle(s), placed {sum(r.placed for r in after_change)}; not in the "
                  f"steady median"))
    if steady:
        print(row("steady cycle (nothing changed)", meter.median("steady"), ("steady", baselines["steady"]),
                  f"; placed {sum(r.placed for r in steady)}"
                  + (f"; only {len(steady)} of {args.repeat} cycles were steady" if len(steady) < args.repeat else "")))
    else:
        print("  steady cycle (nothing changed): none; every cycle measured came after a change")
    print(row(f"churn cycle ({args.finish} ended)", meter.median("churn"), ("churn", baselines["churn"]),
              f"; placed {statistics.median(r.placed for r in churn):.0f}, "
              f"throttled {statistics.median(r.throttled for r in churn):.0f}"))
    if args.grow_to > args.pending:
        if "steady grown" in meter.samples:
            grown = meter.median("steady grown")
            ratio = f"; x{grown.cpu / meter.median('steady').cpu:.2f} the steady cycle above" if steady else ""
            print(row(f"steady at {grown_pending:,} pending", grown, None,
                      f"; {len(meter.samples['steady grown'])} cycle(s){ratio}"))
        else:
            print(f"  steady at {args.grow_to:,} pending: none; the loop did not settle")
        if "churn grown" in meter.samples:
            grown = meter.median("churn grown")
            print(row(f"churn at {grown_pending:,} pending ({args.finish} ended)", grown, None,
                      f"; x{grown.cpu / meter.median('churn').cpu:.2f} the churn cycle above; placed "
                      f"{statistics.median(r.placed for r in grown_churn):.0f}"))
    from bench.scheduler import reference_loop_ms

    reference = reference_loop_ms() / 1000
    against = {name: meter.median(key).cpu / reference for name, key in (
        ("steady", "steady"), (f"steady at {grown_pending or 0:,}", "steady grown"), ("churn", "churn"),
        (f"churn at {grown_pending or 0:,}", "churn grown"), ("first", "first")) if key in meter.samples}
    print(f"  against the reference loop ({reference * 1000:.0f} ms, bench/scheduler.py's; issue 39's goals: "
          f"steady <= 2x, a restart's first cycle <= 15x): " + ", ".join(
              f"{name} {ratio:.1f}x" for name, ratio in against.items()))
    print("  garbage collector (this process, wherever it ran, charged to the cycle before it): " + ", ".join(
        f"{name} {meter.collector_per_run(name) * 1000:.0f} ms" for name in ("first", "steady", "churn")) + " a cycle")
    if phases:
        phases.print()
    if args.statements:
        for phase, seconds in meter.statement_s.items():
            kinds = meter.statements[phase]
            print(f"  {phase} (all runs, slowest first): " + "; ".join(
                f"{kinds[kind]} x {kind} {spent:.2f} s" for kind, spent in seconds.most_common(6)))
    if args.restart:
        runs = []
        for _ in range(max(1, args.restarts)):
            heartbeats()
            runs.append(restarted(redis_server, args.profile, bool(phases), args.statements))
        again = sorted(runs, key=lambda sample: sample.cpu)[len(runs) // 2]
        print(row("restarted: a new process's first", again, ("steady", baselines["steady"]),
                  f"; the lease handed over, nothing kept from the cycles above; {again.cpu / reference:.1f}x "
                  f"the reference loop" + (f" (median of {len(runs)}: " + ", ".join(
                      f"{sample.cpu:.2f}" for sample in runs) + " s)" if len(runs) > 1 else "")))
    if args.save_snapshots:
        import pickle

        heartbeats()
        steady_snapshot = build_snapshot(client)
        finish_some(rng, args.finish)
        with open(args.save_snapshots, "wb") as out:
            pickle.dump({"room": room, "steady": steady_snapshot, "churn": build_snapshot(client), "now": time.time(),
                         "config": scheduler_config()}, out)
        agents_start_placed()
    if args.profile:
        import cProfile
        import pstats

        # Two steady cycles: the first after the churn above still rewrites the ETAs it moved.
        for label, before in (("steady", lambda: None), ("second steady", lambda: None),
                              ("churn", lambda: finish_some(rng, args.finish))):
            heartbeats()
            before()
            profiler = cProfile.Profile()
            profiler.runcall(run_scheduling_cycle)
            agents_start_placed()
            print(f"--- profile of one {label} cycle (own time)")
            stats = pstats.Stats(profiler)
            stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
            stats.print_stats(int(os.environ.get("PROFILE_LINES", "25")))
            if os.environ.get("PROFILE_OUT"):
                stats.dump_stats(f"{os.environ['PROFILE_OUT']}.{label.replace(' ', '-')}")
    redis_server.stop()


if __name__ == "__main__":
    main()
