"""A launch that fails on its node for that node's reason is tried on other nodes, never the same
one again, and fails with every node's reason after three; one that would fail anywhere fails at
once (jobs/services/launch_failures.py, through the agent's JobExited and the scheduling cycle)."""

import time

import pytest

from agents import protocol
from jobs.choices import JobEventKind, JobState
from jobs.models import Allocation, JobEvent
from jobs.services.agent_events import consume_events
from jobs.services.launch_failures import fails_anywhere
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def four_nodes(db, redis_client, live_redis):
    for name in ("n1", "n2", "n3", "n4"):
        GpuFactory(node=NodeFactory(name=name), index=0)
        redis_client.set(protocol.heartbeat_key(name), "{}", ex=60)


def cycle(capture):
    with capture(execute=True):
        return run_scheduling_cycle()


def placed_on(job) -> str:
    return Allocation.objects.get(job=job, released_at__isnull=True).gpu.node.name


def start_fails(redis_client, capture, job, node, error):
    job.refresh_from_db()
    with capture(execute=True):
        redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
            node=node, job_id=job.pk, exit_code=None, error=error, finished_at=time.time(),
            launch_id=f"launch-{job.pk}-{job.attempt}")))
        consume_events(redis_client)
    job.refresh_from_db()


def test_a_node_local_start_failure_is_tried_on_other_nodes_then_fails_with_every_reason(
        four_nodes, redis_client, django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1)
    tried = []
    for _ in range(3):
        cycle(django_capture_on_commit_callbacks)
        node = placed_on(job)
        assert node not in tried, f"placed again on {node}, where its launch already failed"
        tried.append(node)
        start_fails(redis_client, django_capture_on_commit_callbacks, job, node,
                    f"cannot start 'python': No such file or directory (on {node})")
        if len(tried) < 3:
            assert job.state == JobState.PENDING
            assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
            assert f"Could not start on node {node}" in job.wait.reason["message"]
    assert job.state == JobState.FAILED
    assert job.error.startswith("could not start on 3 nodes")
    for node in tried:
        assert f"(on {node})" in job.error
    assert JobEvent.objects.filter(job=job, kind=JobEventKind.REQUEUED).count() == 2


def test_a_node_that_refuses_launches_is_flagged_in_metrics(
        four_nodes, redis_client, django_capture_on_commit_callbacks, client, settings):
    """Jobs go elsewhere, so nothing else would show that one node keeps refusing them."""
    settings.COLONY_METRICS_TOKEN = ""
    job = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    node = placed_on(job)
    start_fails(redis_client, django_capture_on_commit_callbacks, job, node, "cannot start 'python': No such file")
    other = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    start_fails(redis_client, django_capture_on_commit_callbacks, other, placed_on(other),
                "cannot start './train.sh': No such file or directory")  # (the job's fault, not the node's)
    exported = client.get("/metrics").content.decode()
    flagged = [line for line in exported.splitlines() if line.startswith("colony_node_launch_failures_total{")]
    assert flagged == [f'colony_node_launch_failures_total{{node="{node}"}} 1.0']


def test_a_start_failure_that_would_happen_anywhere_fails_at_once(
        four_nodes, redis_client, django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    start_fails(redis_client, django_capture_on_commit_callbacks, job, placed_on(job),
                "cannot start './train.sh': No such file or directory")
    assert job.state == JobState.FAILED
    assert job.error == "cannot start './train.sh': No such file or directory"
    assert not JobEvent.objects.filter(job=job, kind=JobEventKind.REQUEUED).exists()


def test_a_job_that_only_one_node_can_run_waits_rather_than_going_back_there(
        db, redis_client, live_redis, django_capture_on_commit_callbacks):
    GpuFactory(node=NodeFactory(name="only"), index=0)
    redis_client.set(protocol.heartbeat_key("only"), "{}", ex=60)
    job = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    start_fails(redis_client, django_capture_on_commit_callbacks, job, "only",
                "node only: no account for user alice")
    assert job.state == JobState.PENDING
    cycle(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


@pytest.mark.parametrize("error, anywhere", [
    ("cannot start 'python': No such file or directory", False),  # the node's PATH
    ("cannot start '/opt/conda/bin/python': No such file or directory", False),  # the node's install
    ("cannot start './train.sh': Permission denied", True),  # the job's own file
    ("cannot start 'scripts/run': No such file or directory", True),
    ("cannot start 'python': embedded null byte", True),
    ("node n3: no account for user alice", False),
    ("account alice cannot enter /data/x: Permission denied", False),
    ("cannot join the job's cgroup /sys/fs/cgroup/colony/j1: No space left on device; the job was not started "
     "unfenced", False),
    ("code archive 0a1b2c3d4e5f: not a gzip file", True),
    ("the code archive 0a1b2c3d4e5f was not fetched for this launch", False),
])
def test_which_start_failures_would_happen_on_any_node(error, anywhere):
    assert fails_anywhere(error) is anywhere
