"""The snapshot carries the researcher's contract to the core: images need a node with a container
runtime, arrays their cap, dependencies that have not ended, jobs that checkpoint; in a bounded
number of queries however long the queue."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.choices import RunClass, JobState
from jobs.models import Allocation, JobArray, JobDependency
from jobs.services import snapshot_loader
from jobs.services.snapshot_loader import build_snapshot
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


def pending_by_id(snapshot):
    return {j.id: j for j in snapshot.pending}


def test_images_arrays_and_dependencies_reach_the_core(db, redis_client):
    tenant = TenantFactory(slug="vision")
    array = JobArray.objects.create(tenant=tenant, owner=JobFactory(tenant=tenant).owner, name="sweep", spec="0-9%3",
                                    size=10, max_running=3)
    image_job = JobFactory(tenant=tenant, image="pytorch/pytorch:2.3")
    plain = JobFactory(tenant=tenant)
    task = JobFactory(tenant=tenant, array=array, array_index=4)
    running_dep = JobFactory(tenant=tenant, state=JobState.RUNNING)
    failed_dep = JobFactory(tenant=tenant, state=JobState.FAILED)
    waiting = JobFactory(tenant=tenant)
    JobDependency.objects.create(job=waiting, on=running_dep, kind="ok")
    JobDependency.objects.create(job=waiting, on=failed_dep, kind="any")  # ended: no longer waited for
    free = JobFactory(tenant=tenant)
    JobDependency.objects.create(job=free, on=failed_dep, kind="ok")

    jobs = pending_by_id(build_snapshot(redis_client))
    assert jobs[image_job.pk].needs_runtime and not jobs[plain.pk].needs_runtime
    assert (jobs[task.pk].array_id, jobs[task.pk].array_limit) == (array.pk, 3)
    assert (jobs[plain.pk].array_id, jobs[plain.pk].array_limit, jobs[plain.pk].waiting_for) == (None, None, ())
    assert jobs[waiting.pk].waiting_for == ((running_dep.pk, "ok"),)
    assert jobs[free.pk].waiting_for == ()


def test_nodes_carry_their_runtimes_and_running_jobs_checkpoints_and_array(db, redis_client):
    tenant = TenantFactory(slug="vision")
    docker, plain = NodeFactory(name="docker", runtimes=["docker"]), NodeFactory(name="plain")
    gpu = GpuFactory(node=docker, index=0)
    GpuFactory(node=plain, index=0)
    array = JobArray.objects.create(tenant=tenant, owner=JobFactory(tenant=tenant).owner, name="sweep", spec="0-1",
                                    size=2)
    job = JobFactory(tenant=tenant, state=JobState.RUNNING, checkpoints=True, array=array, array_index=0,
                     run_class=RunClass.OPPORTUNISTIC)
    Allocation.objects.create(job=job, gpu=gpu)

    snapshot = build_snapshot(redis_client)
    assert {n.name: n.runtimes for n in snapshot.nodes} == {"docker": frozenset({"docker"}), "plain": frozenset()}
    (running,) = snapshot.running
    assert (running.checkpoints, running.array_id) == (True, array.pk)


def test_each_nodes_links_and_runtimes_reach_the_core_as_it_reported_them(db, redis_client):
    """The slowest NVLink (Gbit/s, as agents report it) becomes the node's GB/s; no NVLink, PCIe's."""
    nvlink = [{"a": 0, "b": 1, "kind": "nvlink", "bandwidth_gbps": 2400}]
    nodes = {name: NodeFactory(name=name, topology=nvlink, runtimes=["podman"]) for name in ("n1", "n2")}
    NodeFactory(name="pcie", topology=[{"a": 0, "b": 1, "kind": "pcie"}])
    seen = {n.name: (n.intra_node_gb_per_s, n.runtimes) for n in build_snapshot(redis_client).nodes}
    assert seen == {"n1": (300.0, frozenset({"podman"})), "n2": (300.0, frozenset({"podman"})),
                    "pcie": (32.0, frozenset())}

    nodes["n2"].topology, nodes["n2"].runtimes = [{**nvlink[0], "bandwidth_gbps": 1200}], []
    nodes["n2"].save()
    seen = {n.name: (n.intra_node_gb_per_s, n.runtimes) for n in build_snapshot(redis_client).nodes}
    assert seen["n1"] == (300.0, frozenset({"podman"})) and seen["n2"] == (150.0, frozenset())


def test_the_snapshot_takes_the_same_queries_for_ten_or_a_hundred_jobs_with_dependencies(db, redis_client):
    tenant = TenantFactory(slug="vision")
    array = JobArray.objects.create(tenant=tenant, owner=JobFactory(tenant=tenant).owner, name="sweep", spec="0-99%8",
                                    size=100, max_running=8)
    blocker = JobFactory(tenant=tenant, state=JobState.RUNNING)

    def add(count):
        for i in range(count):
            job = JobFactory(tenant=tenant, array=array, array_index=i, image="img" if i % 2 else "")
            JobDependency.objects.create(job=job, on=blocker, kind="any")

    def queries():
        snapshot_loader.forget()  # (as a new process builds it: what a cycle kept reads nothing)
        with CaptureQueriesContext(connection) as captured:
            build_snapshot(redis_client)
        return len(captured)

    add(10)
    few = queries()
    add(90)
    assert queries() == few


def test_a_running_job_s_live_utilisation_comes_from_the_nodes_it_holds_gpus_on_only(db, redis_client):
    """A node that says how busy a job it does not run is (a bug, or a node lying about another
    tenant's job) moves nothing: the mean is over the nodes the job holds GPUs on."""
    import time

    from agents.protocol import GpuSample, JobGpuSample, NodeSample
    from monitoring.services import live

    nodes = [NodeFactory(name=name) for name in ("a", "b", "liar")]
    gpus = {node.name: GpuFactory(node=node, index=0) for node in nodes}
    gang = JobFactory(state=JobState.RUNNING, gpus=2)
    alone = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=gang, gpu=gpus["a"])
    Allocation.objects.create(job=gang, gpu=gpus["b"], rank=1)
    Allocation.objects.create(job=alone, gpu=gpus["liar"])

    def sample(node, *usage):
        return NodeSample(node=node, ts=time.time(), seq=1, gpus=[GpuSample(index=0, util_sm=50)],
                          jobs=[JobGpuSample(job_id=job.pk, gpu_index=0, mem_used_mib=100, util_sm=util)
                                for job, util in usage])

    live.store_latest(redis_client, [sample("a", (gang, 40)), sample("b", (gang, 60)),
                                     sample("liar", (alone, 30), (gang, 100))])
    readings = build_snapshot(redis_client).readings.jobs
    assert readings[gang.pk] == 0.5 and readings[alone.pk] == 0.3


def test_nodes_come_by_name_whatever_order_they_registered_in(db, redis_client):
    """(the core keys nodes in this order, and breaks ties between equal nodes by it)"""
    for name in ("zeta", "alpha", "mid"):
        GpuFactory(node=NodeFactory(name=name), index=0)
    assert [node.name for node in build_snapshot(redis_client).nodes] == ["alpha", "mid", "zeta"]


def test_every_field_of_a_pending_job_reaches_its_request_in_its_own_place(db, redis_client):
    # (the loader passes a request's fields by position: each value here is one no other field has)
    from datetime import timedelta

    from django.utils import timezone

    tenant = TenantFactory(slug="vision")
    submitted, reserved = timezone.now() - timedelta(hours=2), timezone.now() - timedelta(minutes=5)
    job = JobFactory(tenant=tenant, gpus=3, gpu_memory_mib=12345, priority=7, gpu_models=["A100-80GB"],
                     opportunistic_only=True, shareable=True, max_nodes=2, max_runtime_s=5400, cpu_milli=3000,
                     host_memory_mib=4096, accepts_unfenced=False, image="pytorch/pytorch:2.3")
    type(job).objects.filter(pk=job.pk).update(submitted_at=submitted, reserved_since=reserved)
    request = pending_by_id(build_snapshot(redis_client))[job.pk]
    assert (request.id, request.tenant, request.gpus, request.gpu_memory_mib, request.priority, request.gpu_milli,
            request.gpu_models, request.opportunistic_only, request.shareable, request.max_nodes,
            request.expected_runtime_s, request.cpu_milli, request.host_memory_mb, request.user,
            request.accepts_unfenced, request.needs_runtime, request.mig_profile, request.allreduce_bytes,
            request.profile, request.array_id, request.waiting_for, request.attained_gpu_s) == (
        job.pk, "vision", 3, 12345, 7, 1000, frozenset({"A100-80GB"}), True, True, 2, 5400.0, 3000, 4096,
        str(job.owner_id), False, True, None, None, None, None, (), 0.0)
    assert request.submitted_at == submitted.timestamp() and request.reserved_since == reserved.timestamp()
