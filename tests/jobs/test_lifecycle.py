"""The job lifecycle, driven through its real entry points (the scheduling cycle, the events
stream, node health, cancel): every attempt is fenced, runtime limits end jobs TIMEOUT, and no
module but the lifecycle writes a job's state."""

import ast
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import lifecycle
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.node_health import check_node_health
from jobs.services.submission import NotCancellable, cancel_job, requeue_job
from monitoring.models import Node
from tests.factories import GpuFactory, JobFactory, NodeFactory

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node1(db, redis_client, live_redis):
    """One node with one GPU, heartbeating: every job below competes for that GPU."""
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def cycle(capture):
    with capture(execute=True):
        return run_scheduling_cycle()


def launches(redis_client):
    return [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if isinstance(c := protocol.decode_command(f), protocol.LaunchJob)]


def stops(redis_client):
    return [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if isinstance(c := protocol.decode_command(f), protocol.StopJob)]


def queries(redis_client):
    return [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
            if isinstance(c := protocol.decode_command(f), protocol.QueryAttempt)]


def report(redis_client, capture, message):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    with capture(execute=True):
        consume_events(redis_client)


def started(job, launch_id, at=None):
    return protocol.JobStarted(node="n1", job_id=job.pk, pid=4242, started_at=at or time.time(), launch_id=launch_id)


def exited(job, launch_id, code=0, **extra):
    return protocol.JobExited(node="n1", job_id=job.pk, exit_code=code, finished_at=time.time(),
                              launch_id=launch_id, **extra)


def ignored_reports(redis_client) -> int:
    return int(redis_client.get(lifecycle.IGNORED_REPORTS_KEY) or 0)


def test_each_placement_is_a_new_attempt_and_an_earlier_attempts_reports_change_nothing(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1)
    cycle(capture)
    first = launches(redis_client)[-1].command_id
    report(redis_client, capture, started(job, first))
    requeue_job(job, by="ops")  # stopped, back to the queue once its node confirms
    report(redis_client, capture, exited(job, first, code=-15, stopped=True))
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    cycle(capture)
    second = launches(redis_client)[-1].command_id
    assert (first, second) == (f"launch-{job.pk}-1", f"launch-{job.pk}-2")

    # The first run's start and a success re-sent after a Redis restart must not touch run 2.
    report(redis_client, capture, started(job, first))
    report(redis_client, capture, exited(job, first, code=0))
    job.refresh_from_db()
    assert job.state == JobState.PLACED and job.attempt == 2
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1
    assert ignored_reports(redis_client) == 2

    report(redis_client, capture, started(job, second))
    report(redis_client, capture, exited(job, second, code=0, output_tail="run 2\n"))
    job.refresh_from_db()
    assert (job.state, job.output_tail) == (JobState.SUCCEEDED, "run 2\n")


def test_node_timed_out_exit_ends_timeout_and_says_the_limit(node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1, max_runtime_s=5)
    cycle(capture)
    launch = launches(redis_client)[-1]
    assert launch.max_runtime_s == 5
    report(redis_client, capture, started(job, launch.command_id))
    report(redis_client, capture, exited(job, launch.command_id, code=-15, stopped=True, timed_out=True))
    job.refresh_from_db()
    assert job.state == JobState.TIMEOUT
    assert "runtime limit of 5 s" in job.error
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_control_plane_times_out_a_job_its_node_did_not_stop_and_keeps_its_gpu_until_the_exit(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    overdue = JobFactory(gpus=1, max_runtime_s=20)
    cycle(capture)
    launch = launches(redis_client)[-1]
    report(redis_client, capture, started(overdue, launch.command_id, at=time.time() - 3600))
    waiting = JobFactory(gpus=1)

    with capture(execute=True):
        result = check_node_health(redis_client)
    overdue.refresh_from_db()
    assert result["timed_out"] == [overdue.pk]
    assert overdue.state == JobState.TIMEOUT and "runtime limit of 20 s" in overdue.error
    assert [s.job_id for s in stops(redis_client)] == [overdue.pk]

    # Its process may still hold the GPU: nothing else is placed there until the node confirms.
    cycle(capture)
    waiting.refresh_from_db()
    assert waiting.state == JobState.PENDING
    report(redis_client, capture, exited(overdue, launch.command_id, code=-15, stopped=True, output_tail="late\n"))
    overdue.refresh_from_db()
    assert (overdue.state, overdue.exit_code, overdue.output_tail) == (JobState.TIMEOUT, -15, "late\n")
    cycle(capture)
    waiting.refresh_from_db()
    assert waiting.state == JobState.PLACED


def test_job_within_its_limit_is_left_running(node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1, max_runtime_s=3600)
    cycle(capture)
    report(redis_client, capture, started(job, launches(redis_client)[-1].command_id, at=time.time() - 60))
    with capture(execute=True):
        assert check_node_health(redis_client)["timed_out"] == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_an_ended_job_cannot_be_cancelled_and_says_why(db):
    job = JobFactory(state=JobState.TIMEOUT)
    with pytest.raises(NotCancellable, match="timeout"):
        cancel_job(job)
    job.refresh_from_db()
    assert job.state == JobState.TIMEOUT


def test_stop_answer_for_an_earlier_attempt_does_not_end_the_current_one(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1)
    cycle(capture)
    # A stale stop's answer ("not running here") arrives while the placed attempt is starting.
    report(redis_client, capture, protocol.JobExited(node="n1", job_id=job.pk, exit_code=None, stopped=True,
                                                     absent=True, finished_at=time.time()))
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    assert Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_node_lost_requeues_once_and_a_late_exit_of_that_run_by_its_stop_is_ignored(
        node1, redis_client, django_capture_on_commit_callbacks, settings):
    capture = django_capture_on_commit_callbacks
    settings.COLONY_NODE_LOST_GRACE_S = 0  # (the grace: tests/jobs/test_exactly_once.py)
    job = JobFactory(gpus=1)
    cycle(capture)
    launch = launches(redis_client)[-1].command_id
    report(redis_client, capture, started(job, launch))
    redis_client.delete(protocol.heartbeat_key("n1"))
    Node.objects.filter(name="n1").update(registered_at=timezone.now() - timedelta(minutes=5))
    with capture(execute=True):
        assert check_node_health(redis_client)["lost"] == ["n1"]
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.PENDING, 1)
    # The lost node's run, ended by the requeue's stop and reported late. (A run that ended by
    # itself, exit 0, wins over the requeue instead: tests/jobs/test_exactly_once.py.)
    report(redis_client, capture, exited(job, launch, code=-15, stopped=True))
    job.refresh_from_db()
    assert (job.state, job.requeue_count) == (JobState.PENDING, 1)


# ---------------------------------------------------------------- one writer of Job.state


def _state_writers(path: Path) -> list[str]:
    """``.update(state=...)``, ``.create(state=...)`` and ``x.state = ...`` in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "update_or_create", "bulk_update"):
            if any(k.arg == "state" for k in node.keywords) or any(
                    isinstance(a, ast.List) and any(getattr(e, "value", None) == "state" for e in a.elts)
                    for a in node.args):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "state" for t in node.targets):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_only_the_lifecycle_package_changes_a_jobs_state():
    lifecycle_dir = REPO / "jobs" / "services" / "lifecycle"
    # Its ``state`` is a message's delivery state (Notification.state), never a job's.
    notifications_file = REPO / "jobs" / "services" / "notifications.py"
    writers = [
        where
        for app in ("jobs", "cluster_ui")
        for path in (REPO / app).rglob("*.py")
        if "migrations" not in path.parts and "scheduling" not in path.parts
        and not path.is_relative_to(lifecycle_dir) and path != notifications_file
        for where in _state_writers(path)
    ]
    assert writers == []
    assert [where for path in lifecycle_dir.glob("*.py") for where in _state_writers(path)], \
        "the check must see the lifecycle's own writes"


# ---------------------------------------------------------------- reconciling with the node


def sample_listing(redis_client, *launch_ids, at=None):
    """The node's latest sample (as ingest keeps it) listing the attempts it runs."""
    from monitoring.services import live

    live.store_latest(redis_client, [protocol.NodeSample(
        node="n1", ts=at or time.time(), seq=1, gpus=[], running_launches=list(launch_ids))])


def running_job(redis_client, capture, **spec):
    job = JobFactory(gpus=1, **spec)
    cycle(capture)
    launch = launches(redis_client)[-1].command_id
    report(redis_client, capture, started(job, launch, at=time.time() - 30))
    return job, launch


def test_a_running_attempt_its_node_does_not_know_is_requeued_within_seconds(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = running_job(redis_client, capture)
    sample_listing(redis_client, launch)
    with capture(execute=True):
        check_node_health(redis_client)
    assert queries(redis_client) == []  # listed: nothing to ask

    sample_listing(redis_client)  # the node's agent restarted without it
    with capture(execute=True):
        check_node_health(redis_client)
    (ask,) = queries(redis_client)
    assert (ask.job_id, ask.launch_id) == (job.pk, launch)  # a question about that attempt, not a stop
    assert stops(redis_client) == []
    # What the agent answers when it does not know the attempt.
    report(redis_client, capture, protocol.JobExited(node="n1", job_id=job.pk, exit_code=None, stopped=True,
                                                     absent=True, launch_id=launch, finished_at=time.time()))
    job.refresh_from_db()
    assert (job.state, job.requeue_count, job.pending_reason["code"]) == (JobState.PENDING, 1, "vanished_from_node")
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_an_exit_lost_on_the_way_is_recovered_by_asking_the_node(node1, redis_client,
                                                                 django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = running_job(redis_client, capture)
    sample_listing(redis_client)  # it ended; its exit event was trimmed away unread
    with capture(execute=True):
        check_node_health(redis_client)
    assert [q.launch_id for q in queries(redis_client)] == [launch]
    # The agent answers a question about an attempt that ended there with that attempt's exit, again.
    report(redis_client, capture, exited(job, launch, code=0, output_tail="done\n"))
    job.refresh_from_db()
    assert (job.state, job.requeue_count, job.output_tail) == (JobState.SUCCEEDED, 0, "done\n")


def test_stops_name_the_attempt_they_are_for(node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, launch = running_job(redis_client, capture)
    with capture(execute=True):
        cancel_job(job)
    assert [(s.job_id, s.launch_id) for s in stops(redis_client)] == [(job.pk, launch)]


def test_a_lost_start_report_is_recovered_from_the_nodes_sample(node1, redis_client,
                                                                 django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1)
    cycle(capture)
    launch = launches(redis_client)[-1].command_id
    sample_listing(redis_client, launch)  # it runs; its JobStarted was trimmed away
    with capture(execute=True):
        check_node_health(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.started_at is not None


def test_a_placed_job_whose_start_and_exit_were_both_lost_is_settled_by_asking(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = JobFactory(gpus=1)
    cycle(capture)
    launch = launches(redis_client)[-1].command_id
    Job.objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(minutes=1))
    sample_listing(redis_client)  # it ran and ended there; neither report arrived
    with capture(execute=True):
        check_node_health(redis_client)
    assert [q.launch_id for q in queries(redis_client)] == [launch]
    report(redis_client, capture, exited(job, launch, code=3))
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    # A node that never got the launch answers "absent": the job stays placed for the re-send.
    other = JobFactory(gpus=1)
    cycle(capture)
    report(redis_client, capture, protocol.JobExited(
        node="n1", job_id=other.pk, exit_code=None, stopped=True, absent=True,
        launch_id=launches(redis_client)[-1].command_id, finished_at=time.time()))
    other.refresh_from_db()
    assert other.state == JobState.PLACED


# ---------------------------------------------------------------- the timeline


def test_the_timeline_shows_each_attempt_and_why_it_ended(node1, redis_client, alice, api, client,
                                                          django_capture_on_commit_callbacks):
    """Placed, preempted (requeued by an operator here), placed again: each attempt is its own
    group with its own GPUs, and the wait between them shows as a wait, not as a placement."""
    from jobs.services.submission import submit_job

    capture = django_capture_on_commit_callbacks
    with capture(execute=True):
        job = submit_job(owner=alice, tenant=alice.memberships.get().tenant, name="twice", command=["true"], gpus=1)
    cycle(capture)
    first = launches(redis_client)[-1].command_id
    report(redis_client, capture, started(job, first))
    with capture(execute=True):
        requeue_job(job, by="ops")
    report(redis_client, capture, exited(job, first, code=-15, stopped=True))
    cycle(capture)
    second = launches(redis_client)[-1].command_id
    report(redis_client, capture, started(job, second))
    report(redis_client, capture, exited(job, second, code=0))

    body = api(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert [(e["attempt"], e["kind"]) for e in body["events"]] == [
        (0, "submitted"), (1, "placed"), (1, "started"), (1, "stopping"), (1, "requeued"),
        (2, "placed"), (2, "started"), (2, "finished")]
    assert "Requeued by operator ops" in body["events"][3]["message"]
    assert "n1 GPU 0" in body["events"][1]["message"]
    assert sorted(a["attempt"] for a in body["allocations"]) == [1, 2]

    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Attempt 1" in page and "Attempt 2" in page and "Back in the queue" in page
    assert page.index("Attempt 1") < page.index("Requeued by operator ops") < page.index("Attempt 2")


def test_a_sample_older_than_the_placement_asks_nothing(node1, redis_client, django_capture_on_commit_callbacks):
    """An agent back late (its last sample predates the placement) must not get questions, let
    alone stops, about a launch it has not read yet."""
    capture = django_capture_on_commit_callbacks
    JobFactory(gpus=1)
    cycle(capture)
    sample_listing(redis_client, at=time.time() - 20)
    with capture(execute=True):
        check_node_health(redis_client)
    assert queries(redis_client) == [] and stops(redis_client) == []


def test_a_run_of_an_earlier_attempt_still_going_on_a_node_is_stopped_by_name(
        node1, redis_client, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, first = running_job(redis_client, capture)
    requeue_job(job, by="ops")
    Job.objects.filter(pk=job.pk).update(attempt=2)  # placed again since; the old run's stop was lost
    sample_listing(redis_client, first)
    with capture(execute=True):
        check_node_health(redis_client)
    assert [(s.job_id, s.launch_id) for s in stops(redis_client)] == [(job.pk, first)]
