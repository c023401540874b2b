"""FGD's target workload counted by tenant and kept from one cycle to the next (``QueueTallies``) is,
whatever the queue went through, the very workload ``Workload.of`` builds from every request:
the same classes in the same order, medians, popularities and weights."""

import random

import pytest

from jobs.scheduling.fragmentation import QueueTallies, Workload
from jobs.scheduling.snapshot import JobRequest

HOSTS = [("A100-80GB", 8, 128_000, 1_000_000), ("A100-80GB", 8, 96_000, 512_000), ("V100-32GB", 4, 48_000, None),
         ("T4", 1, None, None)]


def request(rng, job_id: int, tenant: str) -> JobRequest:
    gpus = rng.choice([1, 1, 1, 2, 4, 8])
    return JobRequest(id=job_id, tenant=tenant, gpus=gpus, submitted_at=float(job_id),
                      gpu_milli=rng.choice([250, 500, 1000]) if gpus == 1 else 1000,
                      gpu_models=rng.choice([frozenset(), frozenset({"A100-80GB"})]),
                      cpu_milli=rng.choice([0, 4000, 64_000, 120_000]), host_memory_mb=rng.choice([0, 8000, 200_000]))


class Running:
    """A running job as the workload reads one (``RunningAsRequest``'s fields)."""

    def __init__(self, rng):
        self.gpus = rng.choice([1, 2, 8])
        self.gpu_milli = rng.choice([500, 1000]) if self.gpus == 1 else 1000
        self.gpu_models, self.cpu_milli, self.host_memory_mb = frozenset(), rng.choice([0, 8000]), rng.choice([0, 4000])


def same(a: Workload, b: Workload) -> bool:
    return a.classes == b.classes and a._weights == b._weights and a.cpu_per_milli == b.cpu_per_milli


@pytest.mark.parametrize("seed", range(6))
def test_after_any_history_the_kept_workload_is_the_one_built_from_every_request(seed):
    rng = random.Random(seed)
    tenants = [f"t{i}" for i in range(5)]
    queues = {tenant: [request(rng, i * 10 + n, tenant) for i in range(rng.randrange(8))]
              for n, tenant in enumerate(tenants)}
    tallies, next_id = QueueTallies(), 1000
    for _ in range(40):
        for _ in range(rng.randrange(4)):
            tenant = rng.choice(tenants)
            jobs = list(queues[tenant])  # (a new list, as a new snapshot's grouping is)
            step = rng.randrange(4)
            if step == 0 or not jobs:
                next_id += 1
                jobs.insert(rng.randrange(len(jobs) + 1), request(rng, next_id, tenant))
            elif step == 1:
                jobs.pop(rng.randrange(len(jobs)))  # placed or cancelled
            elif step == 2:  # an equal request, another object (read again, unchanged)
                index = rng.randrange(len(jobs))
                old = jobs[index]
                jobs[index] = JobRequest(**{name: getattr(old, name) for name in old.__dataclass_fields__})
            else:  # edited in place: another shape
                index = rng.randrange(len(jobs))
                jobs[index] = request(rng, jobs[index].id, tenant)
            queues[tenant] = jobs
        by_tenant = {tenant: jobs for tenant, jobs in queues.items() if jobs}
        running = [Running(rng) for _ in range(rng.randrange(6))]
        every = [job for jobs in by_tenant.values() for job in jobs] + running
        assert same(tallies.workload(by_tenant, running, HOSTS), Workload.of(every, HOSTS))


def test_a_tenant_whose_jobs_are_the_same_is_not_counted_again(monkeypatch):
    rng = random.Random(1)
    queues = {tenant: [request(rng, n * 100 + i, tenant) for i in range(50)] for n, tenant in enumerate("abc")}
    tallies = QueueTallies()
    tallies.workload(queues, [], HOSTS)
    counted = []
    from jobs.scheduling import fragmentation
    real = fragmentation.tally
    monkeypatch.setattr(fragmentation, "tally", lambda requests, split: counted.append(list(requests)) or real(
        counted[-1], split))
    queues = {**queues, "b": queues["b"][1:]}  # (b's first job placed; a and c read again as they were)
    queues["a"] = list(queues["a"])
    workload = tallies.workload(queues, [], HOSTS)
    assert [len(jobs) for jobs in counted] == [49, 0]  # b's queue, and the (no) running jobs
    assert same(workload, Workload.of([job for jobs in queues.values() for job in jobs], HOSTS))
