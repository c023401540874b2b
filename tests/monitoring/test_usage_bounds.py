"""What a node says about a job's GPU memory is bounded: a reading never exceeds the memory of the GPU
it names, a GPU the node does not have or a job not (or no longer) placed there counts for nothing,
and a profile peak is never above the GPUs there are. Otherwise one node reporting 16 TiB for a job
placed on it would leave that tenant's ``profile_key`` waiting forever for a GPU no cluster has."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol, signing
from jobs.choices import JobState
from jobs.models import Allocation, Job, JobProfile
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.profiles import record_profile
from jobs.services.snapshot_loader import build_snapshot
from monitoring.models import JobUsage
from monitoring.services.ingest import Ingestor
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "usage-bounds-test-secret-0123456789"
T4_MIB = 16384


@pytest.fixture(autouse=True)
def auth_required(settings, live_redis):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


@pytest.fixture
def n1(db, redis_client):
    """Node ``n1``, online, one 16 GiB GPU (index 0)."""
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0, uuid="GPU-n1-0", model="T4", memory_mib=T4_MIB)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


@pytest.fixture
def ingestor(redis_client, n1):
    return Ingestor(redis_client, consumer="test")


def signed(redis_client, stream, message, node="n1"):
    redis_client.xadd(stream, signing.signed(protocol.encode(message), signing.node_key(SECRET, node)))


def report(redis_client, capture, message):
    signed(redis_client, protocol.EVENTS_STREAM, message, node=message.node)
    with capture(execute=True):
        consume_events(redis_client)


def usage_sample(node, job_id, mem_mib, gpu_index=0, launches=()):
    return protocol.NodeSample(
        node=node, ts=time.time(), seq=1, gpus=[protocol.GpuSample(index=gpu_index)],
        running_launches=list(launches),
        jobs=[protocol.JobGpuSample(job_id=job_id, gpu_index=gpu_index, mem_used_mib=mem_mib)])


def last_launch(redis_client, node="n1") -> protocol.LaunchJob:
    launches = [c for _, f in redis_client.xrange(protocol.command_stream(node))
                if isinstance(c := protocol.decode_command(f), protocol.LaunchJob)]
    return launches[-1]


def test_a_node_reporting_16_tib_for_its_job_cannot_make_the_profile_unplaceable(
        n1, ingestor, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1, profile_key="train-resnet")
    with capture(execute=True):
        run_scheduling_cycle()
    launch = last_launch(redis_client).command_id
    report(redis_client, capture, protocol.JobStarted(node="n1", job_id=job.pk, pid=4242,
                                                      started_at=time.time() - 5, launch_id=launch))

    signed(redis_client, protocol.METRICS_STREAM,
           usage_sample("n1", job.pk, protocol.MEMORY_MIB_MAX, launches=[launch]))
    result = ingestor.run_once()
    assert (result.samples, result.dead, result.foreign_usage) == (1, 0, 0)
    assert JobUsage.objects.get(job_id=job.pk).peak_gpu_memory_mib == T4_MIB  # clamped to the GPU

    report(redis_client, capture, protocol.JobExited(node="n1", job_id=job.pk, exit_code=0, launch_id=launch,
                                                     finished_at=time.time()))
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert JobProfile.objects.get(tenant=job.tenant, key="train-resnet").peak_gpu_memory_mib == T4_MIB

    nxt = JobFactory(gpus=1, profile_key="train-resnet", tenant=job.tenant)
    with capture(execute=True):
        run_scheduling_cycle()
    nxt.refresh_from_db()
    assert nxt.state == JobState.PLACED, nxt.pending_reason
    assert Allocation.objects.filter(job=nxt, gpu__node=n1, released_at__isnull=True).exists()


def test_readings_for_a_gpu_the_node_does_not_have_are_dropped(n1, ingestor, redis_client):
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=n1.gpus.get(index=0))
    signed(redis_client, protocol.METRICS_STREAM, usage_sample("n1", job.pk, 12000, gpu_index=7))
    result = ingestor.run_once()
    assert (result.samples, result.foreign_usage) == (1, 1)
    assert not JobUsage.objects.filter(job_id=job.pk).exists()


def test_a_node_that_held_the_job_long_ago_speaks_for_it_no_more(n1, ingestor, redis_client):
    """Attempt 1 ran on n1 and was released ten minutes ago; attempt 2 runs on n2. n1's readings for
    the job are dropped; n2's count."""
    n2_gpu = GpuFactory(node=NodeFactory(name="n2"), index=0, uuid="GPU-n2-0", memory_mib=T4_MIB)
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=n1.gpus.get(index=0), attempt=1,
                              released_at=timezone.now() - timedelta(minutes=10))
    Allocation.objects.create(job=job, gpu=n2_gpu, attempt=2)

    signed(redis_client, protocol.METRICS_STREAM, usage_sample("n1", job.pk, T4_MIB))
    result = ingestor.run_once()
    assert (result.samples, result.foreign_usage) == (1, 1)
    assert not JobUsage.objects.filter(job_id=job.pk).exists()

    signed(redis_client, protocol.METRICS_STREAM, usage_sample("n2", job.pk, 3000), node="n2")
    result = ingestor.run_once()
    assert (result.samples, result.foreign_usage) == (1, 0)
    assert JobUsage.objects.get(job_id=job.pk).peak_gpu_memory_mib == 3000


def test_the_last_samples_of_a_job_that_just_ended_still_count(n1, ingestor, redis_client):
    job = JobFactory(state=JobState.SUCCEEDED)
    Allocation.objects.create(job=job, gpu=n1.gpus.get(index=0), released_at=timezone.now() - timedelta(seconds=5))
    signed(redis_client, protocol.METRICS_STREAM, usage_sample("n1", job.pk, 5000))
    result = ingestor.run_once()
    assert (result.samples, result.foreign_usage) == (1, 0)
    assert JobUsage.objects.get(job_id=job.pk).peak_gpu_memory_mib == 5000


def test_a_profile_poisoned_before_the_fix_neither_blocks_its_key_nor_survives_the_next_run(
        n1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1, profile_key="train-resnet")
    JobProfile.objects.create(tenant=job.tenant, key="train-resnet", runs=1,
                              peak_gpu_memory_mib=protocol.MEMORY_MIB_MAX)
    with capture(execute=True):
        run_scheduling_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PLACED, job.pending_reason

    # The run reports 9 GiB and succeeds: the profile heals to what GPUs there are, and what it saw.
    JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=9000, first_seen_at=timezone.now(),
                            last_seen_at=timezone.now())
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, started_at=timezone.now(),
                                         finished_at=timezone.now())
    record_profile(job.pk)
    assert JobProfile.objects.get(tenant=job.tenant, key="train-resnet").peak_gpu_memory_mib == T4_MIB


def test_a_running_jobs_memory_estimate_is_bounded_by_the_gpu_it_holds(n1, redis_client):
    job = JobFactory(state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=n1.gpus.get(index=0))
    JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=protocol.MEMORY_MIB_MAX,  # recorded before the fix
                            first_seen_at=timezone.now(), last_seen_at=timezone.now())
    [running] = build_snapshot(redis_client).running
    assert running.memory_mib == T4_MIB


def test_an_operator_resets_a_profile_by_deleting_it_in_the_admin(n1, client):
    from tests.factories import UserFactory

    job = JobFactory(profile_key="train-resnet")
    profile = JobProfile.objects.create(tenant=job.tenant, key="train-resnet", runs=3, peak_gpu_memory_mib=T4_MIB)
    client.force_login(UserFactory(username="operator", is_staff=True, is_superuser=True))
    assert "train-resnet" in client.get("/admin/jobs/jobprofile/?q=resnet").content.decode()
    response = client.post(f"/admin/jobs/jobprofile/{profile.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not JobProfile.objects.exists()


def test_a_run_without_a_utilisation_reading_does_not_dilute_the_profile_s_mean(n1):
    # MPS clients sharing a GPU (and MIG instances) report no per-job utilisation: such a run
    # adds to the profile's runs and memory, but the mean is over the runs that had a reading.
    tenant = JobFactory(gpus=1).tenant
    for percent in (80.0, None, 20.0):
        job = JobFactory(gpus=1, profile_key="train-resnet", tenant=tenant, state=JobState.SUCCEEDED,
                         started_at=timezone.now() - timedelta(hours=1), finished_at=timezone.now())
        JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=9000, first_seen_at=timezone.now(),
                                last_seen_at=timezone.now(), util_sum=percent or 0.0, util_n=int(percent is not None))
        record_profile(job.pk)
    profile = JobProfile.objects.get(tenant=tenant, key="train-resnet")
    assert (profile.runs, profile.util_runs) == (3, 2)
    assert profile.mean_util == pytest.approx(0.5)  # not 0.6: the run without a reading weighs nothing
