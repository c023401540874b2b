"""The snapshot keeps last cycle's pending requests, running jobs and nodes where nothing they are
built from changed: whatever happens between two cycles, the snapshot it builds is the one a fresh
process builds."""

import random
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import protocol
from agents.protocol import heartbeat_key
from jobs.choices import JobState
from jobs.models import Allocation, Job, JobArray, JobDependency, JobProfile, Tenant
from jobs.scheduling import Decisions
from jobs.scheduling.carry import Carry
from jobs.services import apply, snapshot_loader as snapshot
from jobs.services.snapshot_loader import build_snapshot
from monitoring.models import Gpu, JobUsage, Node
from monitoring.services import live
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory, running_job


def fresh(redis_client):
    """What a process that never built a snapshot builds now (leaving the caches as they were)."""
    kept = {name: getattr(snapshot, name) for name in snapshot.KEPT}
    snapshot.forget()
    try:
        return build_snapshot(redis_client)
    finally:
        for name, value in kept.items():
            setattr(snapshot, name, value)


def mutate(rng, tenants, array, redis_client):
    pending = list(Job.objects.filter(state=JobState.PENDING))
    job = rng.choice(pending) if pending else None
    step = rng.randrange(22)
    if step >= 11:
        return mutate_running(rng, redis_client)
    if step == 0 or job is None:
        JobFactory(tenant=rng.choice(tenants), gpus=rng.choice([1, 2, 4]), profile_key=rng.choice(["", "k"]),
                   gpu_models=rng.choice([[], ["A100-80GB"]]), array=rng.choice([None, array]))
    elif step == 1:
        Job.objects.filter(pk=job.pk).update(priority=job.priority + 1, gpus=rng.choice([1, 2, 4]))
    elif step == 2:
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    elif step == 3:
        Job.objects.filter(pk=job.pk).update(reserved_since=rng.choice([None, timezone.now() - timedelta(seconds=9)]))
    elif step == 4:
        JobDependency.objects.create(job=job, on=JobFactory(tenant=job.tenant, state=JobState.RUNNING),
                                     kind=rng.choice(["ok", "any"]))
    elif step == 5:
        Job.objects.filter(dependants__isnull=False, state=JobState.RUNNING).update(state=JobState.SUCCEEDED)
    elif step == 6:
        JobProfile.objects.update_or_create(tenant=job.tenant, key="k", defaults={
            "peak_gpu_memory_mib": rng.choice([9000, 200000]), "mean_util": rng.choice([None, 0.4]),
            "mean_runtime_s": rng.choice([None, 120.0, 900.0])})
    elif step == 7:
        Tenant.objects.filter(pk=job.tenant_id).update(slug=f"renamed-{rng.randrange(10**6)}")
    elif step == 8:
        Gpu.objects.filter(pk=Gpu.objects.order_by("?").values("pk")[:1]).update(
            memory_mib=rng.choice([40960, 81920, 163840]))
    elif step == 9:
        JobArray.objects.filter(pk=array.pk).update(max_running=rng.choice([None, 1, 3]))
    else:
        Job.objects.filter(pk=job.pk).update(max_runtime_s=rng.choice([None, 60, 3600]), image=rng.choice(["", "img"]),
                                             submitted_at=timezone.now() - timedelta(seconds=rng.randrange(999)))


def mutate_running(rng, redis_client):
    """What happens to running jobs, nodes and their readings between two cycles."""
    holding = list(Allocation.objects.filter(released_at__isnull=True).select_related("job", "gpu"))
    held = rng.choice(holding) if holding else None
    step = rng.randrange(8)
    if step == 0 or held is None:  # a pending job placed on a GPU (a second allocation now and then: a gang)
        job = Job.objects.filter(state=JobState.PENDING).order_by("?").first()
        if job is not None:
            Job.objects.filter(pk=job.pk).update(state=JobState.PLACED, placed_at=timezone.now(),
                                                 run_class=rng.choice(["guaranteed", "opportunistic"]))
            for gpu in Gpu.objects.order_by("?")[:rng.choice([1, 1, 2])]:
                Allocation.objects.create(job=job, gpu=gpu, memory_limit_mib=rng.choice([None, 9000]))
    elif step == 1:
        Job.objects.filter(pk=held.job_id).update(state=rng.choice([JobState.RUNNING, JobState.PREEMPTING]),
                                                  started_at=timezone.now() - timedelta(seconds=rng.randrange(99)))
    elif step == 2:
        Allocation.objects.filter(pk=held.pk).update(duty_cycle=rng.choice([0.0, 0.5, 1.0]))
    elif step == 3:  # it ended
        Allocation.objects.filter(job_id=held.job_id).update(released_at=timezone.now())
        Job.objects.filter(pk=held.job_id).update(state=JobState.SUCCEEDED)
    elif step == 4:
        JobUsage.objects.update_or_create(job_id=held.job_id, defaults={
            "peak_gpu_memory_mib": rng.choice([5000, 300000]), "first_seen_at": timezone.now(),
            "last_seen_at": timezone.now()})
    elif step == 5:
        Node.objects.filter(pk=held.gpu.node_id).update(cordoned=rng.random() < 0.5,
                                                        topology=rng.choice([[], [NVLINK]]))
    elif step == 6:
        Gpu.objects.filter(pk=held.gpu_id).update(isolation=rng.choice(["mps", "memory_limit"]))
    else:  # a node's agent reports (or its heartbeat lapses)
        if rng.random() < 0.3:
            redis_client.delete(heartbeat_key(held.gpu.node.name))
        else:
            redis_client.set(heartbeat_key(held.gpu.node.name), "{}", ex=30)
        live.store_latest(redis_client, [protocol.NodeSample(
            node=held.gpu.node.name, ts=time.time(), seq=rng.randrange(10**6),
            gpus=[protocol.GpuSample(index=held.gpu.index, util_sm=rng.choice([None, 40.0]), mem_total_mib=81920,
                                     mem_used_mib=rng.choice([None, 7000]))],
            jobs=[protocol.JobGpuSample(job_id=held.job_id, gpu_index=held.gpu.index, mem_used_mib=7000,
                                        util_sm=rng.choice([None, 10.0, 55.5]))])])


NVLINK = {"a": 0, "b": 1, "kind": "nvlink", "bandwidth_gbps": 2400}


def random_history_matches_a_fresh_build(redis_client, seed):
    rng = random.Random(seed)
    tenants = [TenantFactory(slug=f"t{i}") for i in range(3)]
    for name in ("n1", "n2"):
        node = NodeFactory(name=name)
        for i in range(4):
            GpuFactory(node=node, index=i)
    array = JobArray.objects.create(tenant=tenants[0], owner=JobFactory(tenant=tenants[0]).owner, name="a",
                                    spec="0-9%3", size=10, max_running=3)
    for i in range(10):
        JobFactory(tenant=tenants[i % 3], gpus=rng.choice([1, 2]), profile_key=rng.choice(["", "k"]))
    for _ in range(12):
        mutate(rng, tenants, array, redis_client)
    apply._decided_on = (None, frozenset(), frozenset())
    carry = Carry()
    for _ in range(40):
        built = build_snapshot(redis_client)
        # (the core's pending jobs by tenant, moved by the requests built again, as the loop has it)
        carry.pending_step(*snapshot.last_pending_step())
        assert list(carry.tenants_of(built.pending).items()) == list(Carry().tenants_of(built.pending).items())
        assert built == fresh(redis_client)
        # (the apply's pending and reserved jobs, kept from one snapshot to the next by the requests
        # built again: ``snapshot_loader.pending_step``)
        assert apply._as_read(built.pending, Decisions()) == (
            {request.id for request in built.pending},
            {request.id for request in built.pending if request.reserved_since is not None})
        for _ in range(rng.randrange(3)):
            mutate(rng, tenants, array, redis_client)


@pytest.mark.parametrize("seed", range(4))
def test_the_snapshot_after_any_history_is_the_one_a_fresh_process_builds(db, redis_client, seed):
    random_history_matches_a_fresh_build(redis_client, seed)


POSTGRESQL = pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's")


@POSTGRESQL
@pytest.mark.parametrize("seed", range(2))
def test_with_each_change_committed_on_its_own_kept_rows_are_still_never_stale(transactional_db, redis_client, seed):
    """Outside a test's one transaction each change gets its own row version, so the snapshot does
    take unchanged rows from its cache: they must still be exactly what a fresh read gives."""
    random_history_matches_a_fresh_build(redis_client, seed)


@POSTGRESQL
def test_only_rows_changed_since_the_last_snapshot_are_read_again(transactional_db, redis_client):
    tenant = TenantFactory(slug="vision")
    jobs = [JobFactory(tenant=tenant) for _ in range(5)]
    build_snapshot(redis_client)

    def rows_read() -> list:
        with CaptureQueriesContext(connection) as captured:
            pending = build_snapshot(redis_client).pending
        full = [q["sql"] for q in captured.captured_queries if "row_version" in q["sql"]]
        return pending, full

    pending, full = rows_read()
    assert full == [] and len(pending) == 5
    Job.objects.filter(pk=jobs[2].pk).update(priority=3)
    pending, full = rows_read()
    assert len(full) == 1 and {j.id: j.priority for j in pending}[jobs[2].pk] == 3


@POSTGRESQL
def test_a_submission_reads_no_live_allocation_again_and_a_running_jobs_change_reads_its_own(
        transactional_db, redis_client):
    """A busy queue writes the jobs table every cycle: the running jobs' allocations (28,000 rows
    at 8,192 nodes) are read again only where they or their job changed."""
    tenant = TenantFactory(slug="vision")
    node = NodeFactory(name="n1")
    gpus = [GpuFactory(node=node, index=i) for i in range(4)]
    owner = JobFactory(tenant=tenant).owner
    jobs = [running_job(tenant, owner, gpus[i:i + 2]) for i in (0, 2)]
    build_snapshot(redis_client)

    read: list[int] = []  # (the allocation rows each snapshot read)
    rows = snapshot._rows

    def counted(queryset):
        found = rows(queryset)
        if queryset.model is Allocation:
            read.extend(row[0] for row in found)
        return found

    def allocation_rows_read():
        read.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(snapshot, "_rows", counted)
            running = {job.id: job for job in build_snapshot(redis_client).running}
        return running, list(read)

    JobFactory(tenant=tenant)  # submitted
    running, read_now = allocation_rows_read()
    assert read_now == [] and set(running) == {job.pk for job in jobs}
    Job.objects.filter(pk=jobs[1].pk).update(state=JobState.PREEMPTING)
    running, read_now = allocation_rows_read()
    assert read_now == [jobs[1].pk] * 2  # (its two allocations, not the other job's)
    assert running[jobs[1].pk].preempting and not running[jobs[0].pk].preempting
    Allocation.objects.filter(job=jobs[0]).update(released_at=timezone.now())
    Job.objects.filter(pk=jobs[0].pk).update(state=JobState.SUCCEEDED)
    running, read_now = allocation_rows_read()
    assert read_now == [] and list(running) == [jobs[1].pk]
    assert running[jobs[1].pk].gpu_ids == (gpus[2].pk, gpus[3].pk)


@POSTGRESQL
def test_a_running_jobs_gpus_come_in_index_order_after_their_indexes_change(transactional_db, redis_client):
    """A node that registers again may number its GPUs otherwise: no allocation or job row moves,
    but a job's GPUs (and which of its allocations comes first) follow the GPUs' new indexes."""
    tenant = TenantFactory(slug="vision")
    node = NodeFactory(name="n1")
    gpus = [GpuFactory(node=node, index=i) for i in range(2)]
    job = running_job(tenant, JobFactory(tenant=tenant).owner, gpus)
    assert build_snapshot(redis_client).running[0].gpu_ids == (gpus[0].pk, gpus[1].pk)
    Gpu.objects.filter(pk=gpus[0].pk).update(index=9)
    Gpu.objects.filter(pk=gpus[1].pk).update(index=0)
    Gpu.objects.filter(pk=gpus[0].pk).update(index=1)
    JobFactory(tenant=tenant)  # (the jobs table written too: the allocations are listed again)
    built = build_snapshot(redis_client)
    assert built == fresh(redis_client) and built.running[0].id == job.pk
    assert built.running[0].gpu_ids == (gpus[1].pk, gpus[0].pk)


@POSTGRESQL
def test_a_job_rewritten_in_a_savepoint_of_the_reading_transaction_is_read_again(transactional_db, redis_client):
    """A row written inside a savepoint carries the savepoint's id, not the transaction's: a
    transaction that wrote the tables keeps none of their rows, pending or running."""
    tenant = TenantFactory(slug="vision")
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    running = running_job(tenant, JobFactory(tenant=tenant).owner, [gpu])  # (committed)
    pending = JobFactory(tenant=tenant)

    def priorities() -> tuple[int, int]:
        built = build_snapshot(redis_client)
        return built.running[0].priority, {job.id: job.priority for job in built.pending}[pending.pk]

    priorities()
    with transaction.atomic():
        JobFactory(tenant=tenant)
        with transaction.atomic():
            for priority in (1, 2):
                Job.objects.filter(pk__in=[running.pk, pending.pk]).update(priority=priority)
                assert priorities() == (priority, priority)
    assert priorities() == (2, 2)


def test_a_row_written_by_the_reading_transaction_is_read_again_next_time(db, redis_client):
    """Inside one transaction a row can change again under the same version: never trusted."""
    job = JobFactory(tenant=TenantFactory(slug="vision"))
    build_snapshot(redis_client)
    for priority in (1, 2):
        Job.objects.filter(pk=job.pk).update(priority=priority)
        assert build_snapshot(redis_client).pending[0].priority == priority


def test_an_unchanged_job_keeps_its_request_and_a_changed_one_gets_a_new_one(db, redis_client):
    tenant = TenantFactory(slug="vision")
    same, edited = JobFactory(tenant=tenant), JobFactory(tenant=tenant)
    before = {j.id: j for j in build_snapshot(redis_client).pending}
    Job.objects.filter(pk=edited.pk).update(priority=5)
    after = {j.id: j for j in build_snapshot(redis_client).pending}
    assert after[same.pk] is before[same.pk]
    assert after[edited.pk].priority == 5 and before[edited.pk].priority == 0


@POSTGRESQL
def test_with_no_row_changed_what_else_a_request_is_built_from_still_shows(transactional_db, redis_client):
    """No pending row moves between these snapshots (so none is read again), but a profile, an
    array's limit, a dependency and a tenant's name do: each must reach the requests."""
    tenant = TenantFactory(slug="vision")
    GpuFactory(node=NodeFactory(name="n1"), index=0)
    array = JobArray.objects.create(tenant=tenant, owner=JobFactory(tenant=tenant).owner, name="a", spec="0-1",
                                    size=2, max_running=2)
    profiled = JobFactory(tenant=tenant, profile_key="k")
    in_array = JobFactory(tenant=tenant, array=array)
    blocked = JobFactory(tenant=tenant)
    JobDependency.objects.create(job=blocked, on=JobFactory(tenant=tenant, state=JobState.RUNNING), kind="ok")
    JobProfile.objects.create(tenant=tenant, key="k", peak_gpu_memory_mib=9000, mean_util=0.5)

    def requests():
        built = build_snapshot(redis_client)
        assert built == fresh(redis_client)
        return {j.id: j for j in built.pending}

    assert requests()[profiled.pk].profile.peak_memory_mib == 9000
    assert requests() == requests()  # (settled: nothing read again from here on)
    JobProfile.objects.filter(tenant=tenant, key="k").update(peak_gpu_memory_mib=12000)
    assert requests()[profiled.pk].profile.peak_memory_mib == 12000
    JobArray.objects.filter(pk=array.pk).update(max_running=1)
    assert requests()[in_array.pk].array_limit == 1
    Job.objects.filter(dependants__isnull=False, state=JobState.RUNNING).update(state=JobState.SUCCEEDED)
    assert requests()[blocked.pk].waiting_for == ()
    Tenant.objects.filter(pk=tenant.pk).update(slug="renamed")
    assert {j.tenant for j in requests().values()} == {"renamed"}


def test_a_profile_runtime_that_is_not_a_number_is_no_estimate(db, redis_client):
    # (mean runtimes are computed from timestamps; a NaN there was written by something else, and
    # would reach the scheduler as a job that may or may not backfill a hold)
    tenant = TenantFactory()
    JobProfile.objects.create(tenant=tenant, key="k", runs=3, peak_gpu_memory_mib=9000, mean_runtime_s=float("nan"))
    bounded = JobFactory(tenant=tenant, profile_key="k", max_runtime_s=600)
    unbounded = JobFactory(tenant=tenant, profile_key="k", max_runtime_s=None)
    requests = {job.id: job for job in fresh(redis_client).pending}
    assert requests[bounded.id].expected_runtime_s == 600.0
    assert requests[unbounded.id].expected_runtime_s is None


def test_a_check_names_the_part_a_wrong_cache_got_wrong_and_answers_what_a_fresh_build_gives(db, redis_client):
    tenant = TenantFactory(slug="vision")
    gpus = [GpuFactory(node=NodeFactory(name="n1"), index=i) for i in range(2)]
    job = running_job(tenant, JobFactory(tenant=tenant).owner, gpus[:1], run_class="opportunistic")
    JobFactory(tenant=tenant)
    build_snapshot(redis_client)
    fresh, differ = snapshot.checked_snapshot(redis_client)
    assert differ == [] and fresh == build_snapshot(redis_client)

    (inputs, nodes), = [snapshot._all_nodes]
    snapshot._all_nodes = (inputs, tuple(replace(node, cordoned=True) for node in nodes))  # (a bug, say)
    entry = snapshot._running_jobs[job.pk]
    snapshot._running_jobs[job.pk] = (*entry[:3], replace(entry[3], duty_cycle=0.25), entry[4])
    snapshot._running_last = None  # (the bug is in a kept job, not in the kept result of them all)
    fresh, differ = snapshot.checked_snapshot(redis_client)
    assert differ == ["nodes", "running"]
    assert not any(node.cordoned for node in fresh.nodes) and fresh.running[0].duty_cycle == 1.0
    assert build_snapshot(redis_client) == fresh  # (what is kept from here on is the fresh build's)


def test_the_loop_checks_its_kept_snapshot_now_and_then_and_says_when_it_was_wrong(
        transactional_db, redis_client, live_redis, monkeypatch, caplog):
    from jobs.services import scheduling_loop

    node = NodeFactory(name="n1")
    gpus = [GpuFactory(node=node, index=i) for i in range(2)]
    redis_client.set(heartbeat_key("n1"), "{}", ex=60)
    tenant = TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=2)
    job = running_job(tenant, JobFactory(tenant=tenant).owner, gpus[:1])
    monkeypatch.setattr(scheduling_loop, "SNAPSHOT_CHECK_EVERY", 2)
    monkeypatch.setattr(scheduling_loop, "_cycles_unchecked", 0)
    for _ in range(4):  # (two of them checked)
        assert scheduling_loop.run_scheduling_cycle().ran
    assert b"snapshot_divergences" not in redis_client.hgetall(scheduling_loop.STATS_KEY)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]

    entry = snapshot._running_jobs[job.pk]
    snapshot._running_jobs[job.pk] = (*entry[:3], replace(entry[3], memory_mib=1), entry[4])
    snapshot._running_last = None  # (the bug is in a kept job, not in the kept result of them all)
    scheduling_loop.run_scheduling_cycle()  # (not checked)
    assert snapshot._running_jobs[job.pk][3].memory_mib == 1
    scheduling_loop.run_scheduling_cycle()
    assert redis_client.hget(scheduling_loop.STATS_KEY, "snapshot_divergences") == b"1"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "(running)" in r.getMessage()]
    assert snapshot._running_jobs[job.pk][3].memory_mib != 1


def test_a_profile_mean_that_is_not_a_number_does_not_make_every_snapshot_build_its_jobs_again(db, redis_client):
    tenant = TenantFactory(slug="vision")
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0)
    JobProfile.objects.create(tenant=tenant, key="k", runs=3, peak_gpu_memory_mib=9000, mean_util=float("nan"),
                              mean_runtime_s=float("nan"))
    JobFactory(tenant=tenant, profile_key="k")
    running_job(tenant, JobFactory(tenant=tenant).owner, [gpu], profile_key="k")
    first, second = build_snapshot(redis_client), build_snapshot(redis_client)
    assert first.pending[0] is second.pending[0] and first.running[0] is second.running[0]


def test_running_jobs_kept_while_nothing_is_written_to_them_still_follow_what_else_they_are_built_from(
        transactional_db, redis_client):
    # With no job or allocation written since, a snapshot hands back the running jobs it built last
    # time; a usage peak reported, a profile learnt, a tenant renamed or a GPU's memory corrected
    # must still show in them.
    tenant = TenantFactory(slug="vision")
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, memory_mib=81920)
    job = running_job(tenant, JobFactory(tenant=tenant).owner, [gpu], profile_key="k")

    def the_job():
        built = build_snapshot(redis_client)
        assert built == fresh(redis_client)
        (running,) = built.running
        return running

    assert the_job().memory_mib is None and the_job().tenant == "vision"
    JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=9000, first_seen_at=timezone.now(),
                            last_seen_at=timezone.now())
    assert the_job().memory_mib == 9000
    JobProfile.objects.create(tenant=tenant, key="k", peak_gpu_memory_mib=12000, mean_util=0.4)
    assert the_job().solo_utilisation == 0.4
    Tenant.objects.filter(pk=tenant.pk).update(slug="vision-2")
    assert the_job().tenant == "vision-2"
    JobUsage.objects.filter(job_id=job.pk).update(peak_gpu_memory_mib=200000)
    Gpu.objects.filter(pk=gpu.pk).update(memory_mib=40960)
    assert the_job().memory_mib == 40960  # (a node-reported peak is bounded by the GPU it holds)
