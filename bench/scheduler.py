"""Benchmark of the pure scheduler core: one cycle over a production-sized snapshot.

    .venv/bin/python -m bench.scheduler [--nodes 1024] [--pending 50000] [--running 10000] [--repeat 5]

Builds a seeded random cluster (1,024 nodes x 8 GPUs in 32 racks, three GPU models, 100 tenants
with guarantees, ceilings, weights and decayed usage, 10,000 running jobs packed on ~90% of the
GPUs with live utilisation, held mostly by tenants other than those owed the capacity, 50,000
pending jobs of mixed shapes: gangs up to 32 GPUs, fractions, recorded profiles, model
constraints, runtimes), runs ``decide()`` several times and prints the
median cycle time and placements per second, the same with the carry a previous cycle on the
same queue left (as the scheduling loop runs it), then the baselines on the same snapshot.
``--steady``: the cycle a full cluster repeats (a few hundred placements, into what its victims
leave), fresh and carried. Prints figures; asserts nothing about time (see CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.scheduling import (  # noqa: E402
    ClusterSnapshot,
    GpuState,
    JobClass,
    RecordedProfile,
    JobRequest,
    LiveReadings,
    NodeState,
    RunningJob,
    TenantQuota,
    decide,
)
from jobs.scheduling.carry import Carry  # noqa: E402
from jobs.scheduling.policies import fifo_exclusive, packing_without_quotas  # noqa: E402

GIB = 1024
NOW = 1_700_000_000.0
MODELS = [("A100-80GB", 80 * GIB, 300.0, 0.6), ("V100M32", 32 * GIB, 150.0, 0.25), ("V100M16", 16 * GIB, 32.0, 0.15)]


def build_nodes(rng: random.Random, count: int, gpus_per_node: int) -> list[NodeState]:
    nodes, gpu_id = [], 0
    for i in range(count):
        model, memory, link, _ = rng.choices(MODELS, weights=[m[3] for m in MODELS])[0]
        gpus = []
        for index in range(gpus_per_node):
            gpus.append(GpuState(id=gpu_id, index=index, model=model, memory_mib=memory))
            gpu_id += 1
        nodes.append(NodeState(name=f"node{i:04d}", gpus=tuple(gpus), rack=f"rack{i // 32:02d}",
                               intra_node_gb_per_s=link, cordoned=rng.random() < 0.005))
    return nodes


def build_tenants(rng: random.Random, count: int, total_gpus: int) -> list[TenantQuota]:
    shares = [rng.lognormvariate(0, 1) for _ in range(count)]
    owed = 0.7 * total_gpus / sum(shares)
    tenants = []
    for i, share in enumerate(shares):
        guaranteed = max(1, round(share * owed))
        tenants.append(TenantQuota(name=f"tenant{i:03d}", guaranteed_gpus=guaranteed,
                                   max_gpus=round(guaranteed * rng.uniform(1.5, 3.0)) + 8,
                                   weight=rng.choice([0.5, 1.0, 1.0, 2.0]), decayed_usage=rng.uniform(0, 5e6)))
    return tenants


def build_running(rng: random.Random, nodes: list[NodeState], tenants: list[TenantQuota],
                  target: int) -> tuple[list[RunningJob], LiveReadings]:
    """Pack jobs node by node (whole-GPU gangs, single GPUs, shared GPUs), ~10% of GPUs left empty;
    with live readings for half the jobs and for the shared GPUs."""
    jobs: list[RunningJob] = []
    held: Counter = Counter()
    guaranteed_held: Counter = Counter()
    # Who holds the cluster is skewed away from who is owed it: some tenants borrow heavily while
    # others sit below their guarantee, which is what makes the scheduler reclaim.
    weights = [t.guaranteed_gpus * rng.lognormvariate(0, 1.2) for t in tenants]
    utilisation: dict[int, float] = {}
    job_utilisation: dict[int, float] = {}

    def add(gpu_ids, memory, milli=1000):
        cost = len(gpu_ids) * milli
        for _ in range(20):  # a tenant at its ceiling holds nothing more: ask another
            tenant = rng.choices(tenants, weights=weights)[0]
            guaranteed = guaranteed_held[tenant.name] + cost <= tenant.guaranteed_gpus * 1000
            if guaranteed or held[tenant.name] + cost <= tenant.max_gpus * 1000:
                break
        else:
            return
        held[tenant.name] += cost
        if guaranteed:
            guaranteed_held[tenant.name] += cost
        known = rng.random() < 0.7
        job_id = 1_000_000 + len(jobs)
        started_at = NOW - rng.uniform(0, 2 * 86400)
        expected_runtime_s = rng.uniform(3600, 4 * 86400) if known else None
        if (live := rng.uniform(0.1, 0.9) if rng.random() < 0.5 else None) is not None:
            job_utilisation[job_id] = live
        jobs.append(RunningJob(
            id=job_id, tenant=tenant.name,
            job_class=JobClass.GUARANTEED if guaranteed else JobClass.OPPORTUNISTIC, gpu_ids=tuple(gpu_ids),
            started_at=started_at, memory_mib=memory, gpu_milli=milli, expected_runtime_s=expected_runtime_s,
            solo_utilisation=rng.uniform(0.3, 0.95) if rng.random() < 0.5 else None,
            duty_cycle=1.0 if guaranteed else rng.choice([0.3, 0.5, 1.0])))

    for node in nodes:
        if len(jobs) >= target:
            break
        free = [g for g in node.gpus]
        capacity = node.gpus[0].memory_mib
        while free and len(jobs) < target:
            roll = rng.random()
            if roll < 0.05:
                free.pop()  # left empty
            elif roll < 0.2 and len(free) >= 4:
                width = 8 if len(free) == 8 and rng.random() < 0.5 else rng.choice([2, 4])
                add([free.pop().id for _ in range(width)], None)
            elif roll < 0.55:
                add([free.pop().id], rng.choice([None, capacity // 2, capacity // 4]))
            else:  # a shared GPU with two or three small jobs
                gpu = free.pop()
                for _ in range(rng.choice([2, 3])):
                    add([gpu.id], capacity // 5, milli=rng.choice([250, 300]))
                utilisation[gpu.id] = rng.uniform(0.3, 0.95)
    return jobs, LiveReadings(gpus=utilisation, jobs=job_utilisation)


def build_pending(rng: random.Random, count: int, tenants: list[TenantQuota]) -> list[JobRequest]:
    jobs = []
    heavy = [rng.paretovariate(1.2) for _ in tenants]  # a few tenants queue most of the work
    for i in range(count):
        tenant = rng.choices(tenants, weights=heavy)[0]
        gpus = rng.choices([1, 2, 4, 8, 16, 32], weights=[65, 12, 10, 10, 2, 1])[0]
        milli = rng.choice([250, 500]) if gpus == 1 and rng.random() < 0.1 else 1000
        memory = rng.choice([None, None, 8 * GIB, 16 * GIB, 24 * GIB, 40 * GIB, 60 * GIB])
        if milli < 1000:
            memory = rng.choice([4 * GIB, 8 * GIB, 12 * GIB])
        profile = None
        if memory and rng.random() < 0.25:
            profile = RecordedProfile(peak_memory_mib=int(memory * rng.uniform(0.3, 0.8)),
                                 mean_utilisation=round(rng.uniform(0.1, 0.9), 2))
        models = rng.choices([frozenset(), frozenset({"V100M16", "V100M32"}), frozenset({"A100-80GB"})],
                             weights=[75, 15, 10])[0]
        jobs.append(JobRequest(
            id=i + 1, tenant=tenant.name, gpus=gpus, submitted_at=NOW - rng.uniform(0, 7 * 86400),
            gpu_memory_mib=memory, priority=rng.choices([0, 1, 2, 5], weights=[80, 10, 7, 3])[0], gpu_milli=milli,
            gpu_models=models, opportunistic_only=rng.random() < 0.1, profile=profile,
            expected_runtime_s=rng.uniform(600, 86400) if rng.random() < 0.6 else None))
    return jobs


def build_snapshot(seed: int, nodes: int, gpus_per_node: int, tenants: int, running: int,
                   pending: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    node_states = build_nodes(rng, nodes, gpus_per_node)
    quotas = build_tenants(rng, tenants, nodes * gpus_per_node)
    running_jobs, readings = build_running(rng, node_states, quotas, running)
    return ClusterSnapshot(nodes=tuple(node_states), pending=tuple(build_pending(rng, pending, quotas)),
                           tenants=tuple(quotas), running=tuple(running_jobs), readings=readings)


def reference_loop_ms() -> float:
    """A fixed pure-Python loop, printed with the figures so runs on different (or noisy) machines
    can be compared: divide the cycle time by it."""
    best = float("inf")
    for _ in range(3):
        started, total = time.process_time(), 0
        for i in range(1_000_000):
            total += i * i % 7
        best = min(best, time.process_time() - started)
    return best * 1000


def measure(policy, snapshot: ClusterSnapshot, repeat: int):
    times, decisions = [], None
    for _ in range(repeat):
        started = time.process_time()  # CPU time of this one thread: the cycle runs on one core
        decisions = policy(snapshot, NOW)
        times.append(time.process_time() - started)
    return statistics.median(times), min(times), decisions


def launched(snapshot: ClusterSnapshot, decisions) -> ClusterSnapshot:
    """The next cycle's snapshot: placements running (as their agents would report them), the
    preempted gone, the rest of the queue the very same requests (as the snapshot loader keeps them)."""
    requests = {job.id: job for job in snapshot.pending}
    placed = {place.job_id for place in decisions.placements}
    stopped = {preempt.job_id for preempt in decisions.preemptions}
    started = tuple(RunningJob(
        id=place.job_id, tenant=requests[place.job_id].tenant, job_class=place.job_class, gpu_ids=place.gpu_ids,
        started_at=NOW, memory_mib=requests[place.job_id].gpu_memory_mib, gpu_milli=place.gpu_milli,
        expected_runtime_s=requests[place.job_id].expected_runtime_s) for place in decisions.placements)
    return ClusterSnapshot(nodes=snapshot.nodes, tenants=snapshot.tenants,
                           pending=tuple(job for job in snapshot.pending if job.id not in placed),
                           running=tuple(job for job in snapshot.running if job.id not in stopped) + started,
                           readings=snapshot.readings)


def steady(snapshot: ClusterSnapshot, repeat: int) -> None:
    """The cycle a full cluster runs over and over: three cycles launched first (placements
    start, victims leave), then the next one measured fresh and with the carry its previous cycle
    left, as the scheduling loop runs it."""
    for _ in range(3):
        snapshot = launched(snapshot, decide(snapshot, NOW))
    before, snapshot = snapshot, launched(snapshot, decide(snapshot, NOW))
    fresh, _, decisions = measure(decide, snapshot, repeat)
    times = []
    for _ in range(repeat):
        carry = Carry()
        decide(before, NOW, carry=carry)
        started = time.process_time()
        carried = decide(snapshot, NOW, carry=carry)
        times.append(time.process_time() - started)
        assert carried == decisions, "a carry must not change a decision"
    print(f"steady cycle: {len(snapshot.pending)} pending ({len(before.pending) - len(snapshot.pending)} left the "
          f"queue since the cycle before), {len(snapshot.running)} running; placed {len(decisions.placements)}, "
          f"preempt {len(decisions.preemptions)}")
    print(f"{'fair_share, steady':24s} median {fresh * 1000:7.1f} ms")
    print(f"{'same, carried':24s} median {statistics.median(times) * 1000:7.1f} ms  "
          f"x{statistics.median(times) / fresh:.2f}  (the carry of the cycle before)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--running", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--steady", action="store_true",
                        help="measure only the steady cycle of a full cluster, fresh and carried")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    snapshot = build_snapshot(args.seed, args.nodes, args.gpus_per_node, args.tenants, args.running, args.pending)
    held = {g for j in snapshot.running for g in j.gpu_ids}
    gpus = args.nodes * args.gpus_per_node
    print(f"snapshot: {args.nodes} nodes x {args.gpus_per_node} GPUs = {gpus} GPUs, {len(snapshot.tenants)} tenants, "
          f"{len(snapshot.running)} running on {len(held)} GPUs ({gpus - len(held)} empty), "
          f"{len(snapshot.pending)} pending  [built in {time.perf_counter() - started:.1f}s, seed {args.seed}]")

    print(f"reference loop (1M iterations of pure Python): {reference_loop_ms():.0f} ms")
    if args.steady:
        steady(snapshot, args.repeat)
        return
    rows = []
    for name, policy in (("fair_share (decide)", decide), ("fifo_exclusive", fifo_exclusive),
                         ("packing_without_quotas", packing_without_quotas)):
        median, best, decisions = measure(policy, snapshot, args.repeat)
        rows.append((name, median, decisions))
        placed = len(decisions.placements)
        print(f"{name:24s} median {median * 1000:7.1f} ms  (min {best * 1000:6.1f} ms, {args.repeat} runs)  "
              f"placed {placed:5d} ({placed / median:8.0f} placements/s)  pending {len(decisions.pending)}  "
              f"preempt {len(decisions.preemptions)}  throttle {len(decisions.throttles)}  "
              f"reserve {len(decisions.reservations)}")
    # As the scheduling loop runs it: with what the previous cycle left (here: the same queue).
    carry = Carry()
    decide(snapshot, NOW, carry=carry)
    median, best, carried = measure(lambda s, now: decide(s, now, carry=carry), snapshot, args.repeat)
    assert carried == rows[0][2], "a carry must not change a decision"
    print(f"{'fair_share, carried':24s} median {median * 1000:7.1f} ms  "
          f"(min {best * 1000:6.1f} ms, {args.repeat} runs)  "
          f"x{median / rows[0][1]:.2f} of fair_share without: "
          "the queue step reuses last cycle's sorted queues and shapes")
    fair, fifo = rows[0], rows[1]
    print(f"fair_share / fifo_exclusive: cycle time x{fair[1] / fifo[1]:.2f}, "
          f"placements x{len(fair[2].placements) / max(1, len(fifo[2].placements)):.2f}")
    codes = Counter(p.reason.code.value for p in fair[2].pending)
    print("fair_share pending reasons: " + ", ".join(f"{code} {n}" for code, n in codes.most_common()))
    with_eta = sum(1 for p in fair[2].pending if p.eta_at is not None)
    print(f"fair_share pending with an ETA: {with_eta}")


if __name__ == "__main__":
    main()
