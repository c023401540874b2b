"""Agent events on the events stream move jobs through their states; garbage is dead-lettered."""

import time

import pytest

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.services.agent_events import consume_events
from monitoring.models import Node
from tests.factories import GpuFactory, JobFactory, NodeFactory


@pytest.fixture
def placed_job(db):
    node = NodeFactory(name="n1")
    gpu = GpuFactory(node=node, index=0)
    job = JobFactory(state=JobState.PLACED)
    Allocation.objects.create(job=job, gpu=gpu)
    return job


def emit(redis_client, message):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))


def started(job, node="n1"):
    return protocol.JobStarted(node=node, job_id=job.pk, pid=1234, started_at=time.time())


def exited(job, code, node="n1", **extra):
    return protocol.JobExited(node=node, job_id=job.pk, exit_code=code, finished_at=time.time(), **extra)


def dead_letters(redis_client):
    return [fields for _, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def test_registration_creates_the_node_and_its_gpus(db, redis_client, live_redis):
    gpus = [protocol.GpuInfo(index=i, uuid=f"GPU-{i}", model="H100-80GB", memory_mib=81559) for i in range(8)]
    emit(redis_client, protocol.NodeRegistered(node="fresh", gpus=gpus, backend="simulated",
                                               agent_version="0.1.0", hostname="h"))
    assert consume_events(redis_client) == 1
    node = Node.objects.get(name="fresh")
    assert node.gpus.filter(present=True).count() == 8


def test_started_then_exit_0_succeeds_and_frees_the_gpus(placed_job, redis_client, live_redis):
    emit(redis_client, started(placed_job))
    emit(redis_client, exited(placed_job, 0, output_tail="hello\n"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.SUCCEEDED
    assert (placed_job.exit_code, placed_job.output_tail) == (0, "hello\n")
    assert placed_job.started_at and placed_job.finished_at
    assert not Allocation.objects.filter(job=placed_job, released_at__isnull=True).exists()


def test_nonzero_exit_fails_with_its_code(placed_job, redis_client, live_redis):
    emit(redis_client, started(placed_job))
    emit(redis_client, exited(placed_job, 3))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert (placed_job.state, placed_job.exit_code) == (JobState.FAILED, 3)


def test_launch_error_fails_the_job_with_the_reason(placed_job, redis_client, live_redis):
    # (One that may be the node's, a bare 'pyhton' on its PATH, is tried elsewhere: test_launch_failures.py.)
    emit(redis_client, exited(placed_job, None, error="cannot start './pyhton': No such file or directory"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.FAILED
    assert "pyhton" in placed_job.error


def test_exit_of_a_cancelling_job_cancels_it(placed_job, redis_client, live_redis):
    placed_job.state = JobState.CANCELLING
    placed_job.save()
    emit(redis_client, exited(placed_job, -15, stopped=True))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.CANCELLED


def test_duplicate_exit_event_changes_nothing(placed_job, redis_client, live_redis):
    emit(redis_client, exited(placed_job, 0))
    emit(redis_client, exited(placed_job, 1))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert (placed_job.state, placed_job.exit_code) == (JobState.SUCCEEDED, 0)


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"m": "{not json"}, "Invalid JSON"),
        ({"m": '{"v": 2, "kind": "job_started"}'}, "v"),
        ({"m": '{"v": 1, "kind": "job_started", "node": "n1"}'}, "job_id"),
        ({"m": b"\xff\xfe\x00garbage"}, "not UTF-8"),
        ({"m": "x" * (protocol.MAX_MESSAGE_BYTES + 1)}, "exceeds"),
        ({"other": "1"}, "unexpected stream fields"),
    ],
)
def test_garbage_goes_to_dead_letters_and_changes_nothing(placed_job, redis_client, live_redis, fields, reason):
    redis_client.xadd(protocol.EVENTS_STREAM, fields)
    emit(redis_client, started(placed_job))  # a good event behind the bad one still applies
    consume_events(redis_client)
    (letter,) = dead_letters(redis_client)
    assert reason in letter[b"reason"].decode()
    assert redis_client.get(protocol.DEAD_LETTER_COUNT_KEY) == b"1"
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.RUNNING
    assert redis_client.xpending(protocol.EVENTS_STREAM, "control-plane")["pending"] == 0


def test_node_cannot_report_on_a_job_placed_elsewhere(placed_job, redis_client, live_redis):
    NodeFactory(name="intruder")
    emit(redis_client, exited(placed_job, 0, node="intruder"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.PLACED
    (letter,) = dead_letters(redis_client)
    assert b"never placed on node intruder" in letter[b"reason"]


@pytest.mark.parametrize("state", [JobState.PLACED, JobState.RUNNING])
def test_a_job_its_agent_ended_by_restarting_goes_back_to_the_queue(placed_job, redis_client, live_redis, state):
    placed_job.state = state
    placed_job.save()
    emit(redis_client, exited(placed_job, None, stopped=True, requeue=True,
                              error="the node's agent restarted while the job ran; its process was stopped"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert (placed_job.state, placed_job.requeue_count, placed_job.exit_code) == (JobState.PENDING, 1, None)
    assert placed_job.pending_reason["code"] == "agent_restarted" and "n1" in placed_job.pending_reason["message"]
    assert not Allocation.objects.filter(job=placed_job, released_at__isnull=True).exists()


def test_a_job_stopped_because_its_mps_gpu_failed_is_requeued_with_that_reason(placed_job, redis_client, live_redis):
    placed_job.state = JobState.RUNNING
    placed_job.save()
    why = "the MPS server of GPU 0 (pid 4242) died, taking every client on that GPU with it"
    emit(redis_client, exited(placed_job, None, stopped=True, requeue=True, requeue_cause="gpu_sharing_fault",
                              error=f"{why}; the job was stopped to run again"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert (placed_job.state, placed_job.requeue_count) == (JobState.PENDING, 1)
    assert placed_job.pending_reason["code"] == "gpu_sharing_fault"
    assert why in placed_job.pending_reason["message"] and "node n1" in placed_job.pending_reason["message"]


def test_requeue_does_not_undo_a_cancel(placed_job, redis_client, live_redis):
    placed_job.state = JobState.CANCELLING
    placed_job.save()
    emit(redis_client, exited(placed_job, -15, stopped=True, requeue=True))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.CANCELLED


def test_a_node_registering_again_is_told_each_running_jobs_duty_cycle(placed_job, redis_client, live_redis):
    placed_job.state = JobState.RUNNING
    placed_job.save()
    Allocation.objects.filter(job=placed_job).update(duty_cycle=0.4)
    gpus = [protocol.GpuInfo(index=0, uuid="GPU-0", model="H100-80GB", memory_mib=81559)]
    emit(redis_client, protocol.NodeRegistered(node="n1", gpus=gpus, backend="simulated", agent_version="x",
                                               hostname="h", running_jobs=[placed_job.pk]))
    consume_events(redis_client)
    commands = [protocol.decode_command(f) for _, f in redis_client.xrange(protocol.command_stream("n1"))]
    assert [(c.kind, c.job_id, getattr(c, "duty_cycle", None)) for c in commands] == [
        ("set_duty_cycle", placed_job.pk, 0.4), ("resume", placed_job.pk, None)]  # in case it was suspended


def test_a_gang_requeued_by_one_nodes_agent_waits_for_its_other_node_then_queues_not_fails(
        db, redis_client, live_redis, django_capture_on_commit_callbacks):
    job = JobFactory(state=JobState.RUNNING, gpus=2)
    for name in ("n1", "n2"):
        Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name=name), index=0))
    emit(redis_client, exited(job, None, node="n1", stopped=True, requeue=True, error="agent restarted"))
    with django_capture_on_commit_callbacks(execute=True):
        consume_events(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING  # n2's GPU is still busy until its process stops
    assert [protocol.decode_command(f).kind for _, f in redis_client.xrange(protocol.command_stream("n2"))] == ["stop"]
    emit(redis_client, exited(job, -15, node="n2", stopped=True))
    consume_events(redis_client)
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.PENDING, 1)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_job_being_stopped_whose_node_never_ran_it_is_settled_by_the_nodes_answer(placed_job, redis_client,
                                                                                    live_redis):
    placed_job.state = JobState.PREEMPTING  # placed, launch lost, then preempted
    placed_job.save()
    emit(redis_client, exited(placed_job, None, stopped=True, absent=True, error="not running on this node"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.PENDING


def test_a_stale_not_running_answer_does_not_end_a_later_attempt_placed_on_that_node(placed_job, redis_client,
                                                                                    live_redis):
    emit(redis_client, exited(placed_job, None, stopped=True, absent=True, error="not running on this node"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.PLACED  # its launch is on the way; the stop was for an earlier attempt
    assert Allocation.objects.filter(job=placed_job, released_at__isnull=True).exists()


def test_an_earlier_runs_exit_does_not_end_the_current_run(placed_job, redis_client, live_redis):
    placed_job.state, placed_job.attempt = JobState.RUNNING, 1  # attempt 1 runs; attempt 0 was preempted
    placed_job.save()
    emit(redis_client, exited(placed_job, 0, launch_id=f"launch-{placed_job.pk}-0"))  # re-sent after a Redis restart
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert placed_job.state == JobState.RUNNING
    emit(redis_client, exited(placed_job, 3, launch_id=f"launch-{placed_job.pk}-1"))
    consume_events(redis_client)
    placed_job.refresh_from_db()
    assert (placed_job.state, placed_job.exit_code) == (JobState.FAILED, 3)


def test_a_node_cannot_register_another_nodes_gpus(db, redis_client, live_redis):
    """One node's key must not shrink the cluster by claiming GPUs another node has."""
    victim = NodeFactory(name="victim")
    for i in range(2):
        GpuFactory(node=victim, index=i, uuid=f"GPU-victim-{i}")
    emit(redis_client, protocol.NodeRegistered(
        node="thief", backend="simulated", agent_version="0.1.0", hostname="h",
        gpus=[protocol.GpuInfo(index=0, uuid="GPU-victim-1", model="H100-80GB", memory_mib=81559)]))
    consume_events(redis_client)
    assert victim.gpus.filter(present=True).count() == 2
    assert not Node.objects.filter(name="thief").exists()
    (letter,) = dead_letters(redis_client)
    assert b"GPU-victim-1 (on victim)" in letter[b"reason"]


def test_a_nodes_refusal_of_a_command_is_dead_lettered_by_the_control_plane(db, redis_client, live_redis):
    emit(redis_client, protocol.CommandRejected(node="n1", entry_id="1-1", reason="unsigned"))
    consume_events(redis_client)
    (letter,) = dead_letters(redis_client)
    assert letter[b"source"] == protocol.command_stream("n1").encode()
    assert letter[b"reason"] == b"refused by node n1: unsigned"
