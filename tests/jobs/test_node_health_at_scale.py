"""Node health over many nodes: the check asks the database the same few questions however many
nodes report, and still acts on the right node."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import node_health
from jobs.services.commands import launch_id
from jobs.tasks import check_node_health
from monitoring.models import Gpu, Node
from monitoring.services import live
from monitoring.services.health import REDIS_SEEN_SINCE_KEY
from tests.factories import JobFactory, TenantFactory, UserFactory


@pytest.fixture
def cluster(db, live_redis, redis_client):
    """Adds ``n`` nodes of two GPUs, each running a job on GPU 0 for five minutes (every third
    with a runtime limit), heartbeating; returns {node name: its job}."""
    redis_client.set(REDIS_SEEN_SINCE_KEY, time.time() - 3600)  # (nodes are judged: no Redis restart grace)
    tenant, owner = TenantFactory(), UserFactory()
    jobs_by_node: dict[str, Job] = {}

    def grow(n: int) -> dict[str, Job]:
        earlier = timezone.now() - timedelta(minutes=5)
        first = len(jobs_by_node)
        nodes = Node.objects.bulk_create([Node(name=f"node{i:04d}", registered_at=earlier)
                                          for i in range(first, first + n)])
        gpus = Gpu.objects.bulk_create([Gpu(node=node, index=index, uuid=f"GPU-{node.name}-{index}",
                                            model="A100-80GB", memory_mib=81920)
                                        for node in nodes for index in range(2)])
        jobs = Job.objects.bulk_create([
            Job(tenant=tenant, owner=owner, name=f"r{node.name}", command=["true"], gpus=1, state=JobState.RUNNING,
                placed_at=earlier, started_at=earlier, max_runtime_s=(3600, None, 7200)[i % 3])
            for i, node in enumerate(nodes)])
        Allocation.objects.bulk_create([Allocation(job=job, gpu=gpu) for job, gpu in zip(jobs, gpus[::2])])
        jobs_by_node.update((node.name, job) for node, job in zip(nodes, jobs))
        pipe = redis_client.pipeline(transaction=False)
        for name in jobs_by_node:
            pipe.set(protocol.heartbeat_key(name), "{}", ex=10)
        pipe.execute()
        return jobs_by_node

    return grow


def report(redis_client, jobs_by_node, *, running=None):
    """Every node's sample: the job it holds, unless ``running`` says what a node runs instead."""
    running = running or {}
    samples = []
    for name, job in jobs_by_node.items():
        jobs = running.get(name, [job])
        samples.append(protocol.NodeSample(
            node=name, ts=time.time(), seq=1, gpus=[], running_jobs=[j.pk for j in jobs],
            running_launches=[launch_id(j.pk, j.attempt) for j in jobs], duty_cycles=[1.0] * len(jobs)))
    live.store_latest(redis_client, samples)


def queries_of_a_check() -> int:
    with CaptureQueriesContext(connection) as captured:
        outcome = check_node_health()
    assert outcome == {"lost": [], "revived": [], "strays_stopped": 0, "vanished": 0, "timed_out": [],
                       "duty_cycles_resent": 0}
    return len(captured)


def test_a_quiet_check_asks_the_database_as_often_at_200_nodes_as_at_50(cluster, redis_client):
    jobs_by_node = cluster(50)
    report(redis_client, jobs_by_node)
    at_50 = queries_of_a_check()

    jobs_by_node = cluster(150)
    report(redis_client, jobs_by_node)
    assert queries_of_a_check() == at_50
    assert at_50 <= 8
    assert Job.objects.filter(state=JobState.RUNNING).count() == 200  # (nothing was touched)


def test_among_200_nodes_the_stray_and_the_vanished_job_are_settled_on_their_own_nodes(
        cluster, redis_client, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(node_health, "VANISHED_AFTER_S", 0)  # (missing once is gone, here)
    jobs_by_node = cluster(200)
    stray = JobFactory(state=JobState.SUCCEEDED)
    vanished = jobs_by_node["node0123"]
    report(redis_client, jobs_by_node, running={"node0017": [jobs_by_node["node0017"], stray], "node0123": []})

    with django_capture_on_commit_callbacks(execute=True):
        outcome = check_node_health()

    assert outcome["strays_stopped"] == 1 and outcome["vanished"] == 1
    commands = {name: [protocol.decode_command(fields) for _, fields in redis_client.xrange(
        protocol.command_stream(name))] for name in jobs_by_node}
    assert {name for name, sent in commands.items() if sent} == {"node0017", "node0123"}
    assert [(type(c), c.job_id) for c in commands["node0017"]] == [(protocol.StopJob, stray.pk)]
    assert (protocol.QueryAttempt, vanished.pk) in [(type(c), c.job_id) for c in commands["node0123"]]
    vanished.refresh_from_db()
    assert vanished.state == JobState.PENDING
    assert vanished.pending_reason["code"] == "vanished_from_node"
    assert "node0123" in vanished.pending_reason["message"]
    assert Job.objects.filter(state=JobState.RUNNING).count() == 199


def test_among_quiet_nodes_an_earlier_attempt_and_a_lost_start_are_still_found_on_their_own_nodes(
        cluster, redis_client, django_capture_on_commit_callbacks):
    # Most nodes run exactly their jobs' current attempts (their launches are neither parsed nor
    # their attempts read); one also runs an earlier attempt of its job, one runs a job whose
    # start report was lost (still PLACED here).
    jobs_by_node = cluster(60)
    earlier = jobs_by_node["node0007"]
    Job.objects.filter(pk=earlier.pk).update(attempt=2)
    earlier.refresh_from_db()
    placed = jobs_by_node["node0042"]
    Job.objects.filter(pk=placed.pk).update(state=JobState.PLACED)
    samples = []
    for name, job in jobs_by_node.items():
        launches = [launch_id(job.pk, job.attempt)] + ([launch_id(job.pk, 1)] if name == "node0007" else [])
        samples.append(protocol.NodeSample(node=name, ts=time.time(), seq=1, gpus=[], running_jobs=[job.pk],
                                           running_launches=launches, duty_cycles=[1.0]))
    live.store_latest(redis_client, samples)

    with django_capture_on_commit_callbacks(execute=True):
        outcome = check_node_health()

    assert outcome["strays_stopped"] == 1 and outcome["vanished"] == 0
    commands = {name: [protocol.decode_command(fields) for _, fields in redis_client.xrange(
        protocol.command_stream(name))] for name in jobs_by_node}
    assert {name for name, sent in commands.items() if sent} == {"node0007"}
    assert [(type(c), c.job_id, c.launch_id) for c in commands["node0007"]] == [
        (protocol.StopJob, earlier.pk, launch_id(earlier.pk, 1))]
    placed.refresh_from_db()
    assert placed.state == JobState.RUNNING  # its node runs it: the lost start is taken as said
