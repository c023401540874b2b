"""The scheduling cycle service: snapshot from the DB + heartbeats, decisions persisted, launch
commands published to the node's command stream after commit."""

import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.scheduling_loop import LOCK_KEY, run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def online_node(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(4):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=30)
    return node


def launches(redis_client, node="n1"):
    return [protocol.decode_command(fields) for _, fields in redis_client.xrange(protocol.command_stream(node))]


def test_pending_job_is_placed_and_its_node_told_to_launch(online_node, redis_client,
                                                           django_capture_on_commit_callbacks):
    job = JobFactory(gpus=2, command=["python", "-c", "print(1)"])
    with django_capture_on_commit_callbacks(execute=True):
        result = run_scheduling_cycle()
    assert (result.ran, result.placed) == (True, 1)
    job.refresh_from_db()
    assert job.state == JobState.PLACED and job.placed_at
    (launch,) = launches(redis_client)
    assert launch.job_id == job.pk
    assert launch.argv == ["python", "-c", "print(1)"]
    assert sorted(launch.gpu_indices) == [0, 1]
    assert sorted(Allocation.objects.filter(job=job).values_list("gpu__index", flat=True)) == [0, 1]


def test_second_cycle_places_nothing_twice(online_node, redis_client, django_capture_on_commit_callbacks):
    JobFactory(gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
        second = run_scheduling_cycle()
    assert second.placed == 0
    assert len(launches(redis_client)) == 1


def test_job_that_cannot_fit_stores_why(online_node):
    job = JobFactory(gpus=8, max_nodes=1)
    run_scheduling_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.pending_reason["code"] == "gang_larger_than_any_node"
    assert "Needs 8 GPUs on one node" in job.pending_reason["message"]


def test_node_without_heartbeat_gets_nothing(online_node, redis_client):
    redis_client.delete(protocol.heartbeat_key("n1"))
    job = JobFactory(gpus=1)
    run_scheduling_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.pending_reason["code"] == "no_nodes_online"


def test_cordoned_node_gets_nothing(online_node):
    online_node.cordoned = True
    online_node.save()
    job = JobFactory(gpus=1)
    run_scheduling_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_cycle_does_not_run_while_another_holds_the_lock(online_node, redis_client):
    redis_client.set(LOCK_KEY, "someone-else", ex=30)
    job = JobFactory(gpus=1)
    assert run_scheduling_cycle().ran is False
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_cancelled_job_is_not_placed(online_node):
    job = JobFactory(gpus=1, state=JobState.CANCELLED)
    assert run_scheduling_cycle().placed == 0
    assert not Allocation.objects.filter(job=job).exists()


def test_database_outage_pauses_the_loop_with_a_doubling_backoff_then_resumes(online_node, redis_client, monkeypatch):
    from django.db import OperationalError

    from jobs.services import scheduling_loop as cycle_module

    def unreachable(client):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(cycle_module, "build_snapshot", unreachable)
    assert run_scheduling_cycle().backed_off
    assert 0 < redis_client.pttl(cycle_module.BACKOFF_KEY) <= 2000
    assert run_scheduling_cycle().backed_off  # skipped without touching the database
    redis_client.delete(cycle_module.BACKOFF_KEY)
    run_scheduling_cycle()
    assert 2000 < redis_client.pttl(cycle_module.BACKOFF_KEY) <= 4000  # doubled
    monkeypatch.undo()
    redis_client.delete(cycle_module.BACKOFF_KEY)
    job = JobFactory(gpus=1)
    assert run_scheduling_cycle().ran
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    assert not redis_client.exists(cycle_module.BACKOFF_KEY + ":next")


def test_the_garbage_collector_is_left_as_the_cycle_found_it_however_the_cycle_ends(online_node, redis_client,
                                                                                   monkeypatch):
    """The loop pauses the collector for a cycle (a worker that found it off keeps it off)."""
    import gc

    from django.db import InternalError

    from jobs.services import scheduling_loop as cycle_module

    def broken(client):
        raise InternalError("a bug in the snapshot")

    JobFactory(gpus=1)
    was_enabled = gc.isenabled()
    try:
        for collecting in (True, False):
            (gc.enable if collecting else gc.disable)()
            assert run_scheduling_cycle().ran  # placed
            redis_client.set(LOCK_KEY, "someone-else", ex=30)
            assert not run_scheduling_cycle().ran  # another worker's turn
            redis_client.delete(LOCK_KEY)
            with monkeypatch.context() as patched:
                patched.setattr(cycle_module, "build_snapshot", broken)
                with pytest.raises(InternalError):
                    run_scheduling_cycle()
            assert gc.isenabled() is collecting
    finally:
        (gc.enable if was_enabled else gc.disable)()
