"""Idle-GPU reclaim: a tenant's idle policy, applied by the beat task's service to jobs whose GPUs
the rollups show idle, each step at its time and once per idle spell; the job page and API say
what comes next before it happens."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import psutil
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents import protocol, signing
from agents.accounts import RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.runner import JobRunner
from jobs.choices import JobEventKind, JobState, RunClass
from jobs.models import Job, JobEvent, Notification, NotificationSettings
from jobs.services import idle_reclaim
from jobs.services.agent_events import consume_events
from jobs.services.commands import send_launch
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.tasks import reclaim_idle_gpus
from monitoring.models import GpuRollup
from tests.agents.helpers import events, python, status, wait_for
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory, UserFactory, running_job

SECRET = "i" * 40
POLICY = dict(idle_notify_minutes=10, idle_opportunistic_minutes=20, idle_suspend_minutes=30, idle_requeue_minutes=60)


def fill(gpus, start, end, util):
    """10 s rollups for each GPU in [start, end), as ingest writes them."""
    rows, at = [], start
    while at < end:
        rows += [GpuRollup(gpu=gpu, resolution=10, bucket_start=at, samples=10, util_sum=util * 10, util_n=10,
                           util_max=util, mem_sum=0, mem_n=0) for gpu in gpus]
        at += timedelta(seconds=10)
    GpuRollup.objects.bulk_create(rows)


def commands(redis_client, node):
    return [(fields, protocol.decode_command(fields))
            for _id, fields in redis_client.xrange(protocol.command_stream(node))]


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def idle_job(vision, alice, cluster, now, settings, live_redis):
    """alice's guaranteed 2-GPU job on a1: busy for its first hour, idle (1%) for the last 90 min."""
    settings.COLONY_AGENT_SECRET = SECRET
    vision.__dict__.update(POLICY)
    vision.save()
    gpus = [cluster["a1/0"], cluster["a1/1"]]
    job = running_job(vision, alice, gpus, started_at=now - timedelta(minutes=150), attempt=1)
    job.allocations.update(attempt=1)
    idle_from = now - timedelta(minutes=90)
    fill(gpus, now - timedelta(minutes=150), idle_from, 80.0)
    fill(gpus, idle_from, now, 1.0)
    return job, idle_from


def reclaim_at(capture, when):
    with capture(execute=True):
        return idle_reclaim.reclaim(now=when)


def idle_events(job):
    return list(JobEvent.objects.filter(job=job, kind=JobEventKind.IDLE).values_list("message", flat=True))


def test_each_step_fires_at_its_time_and_once(idle_job, alice, redis_client, django_capture_on_commit_callbacks):
    job, idle_from = idle_job
    NotificationSettings.objects.create(user=alice, email=True, events=["idle"])
    minutes = lambda m: idle_from + timedelta(minutes=m)  # noqa: E731

    assert reclaim_at(django_capture_on_commit_callbacks, minutes(9))["notify"] == 0
    assert idle_events(job) == []

    for _ in range(2):
        reclaim_at(django_capture_on_commit_callbacks, minutes(11))
    [warned] = idle_events(job)
    assert warned.startswith("Warned: idle 11 min (all 2 GPUs under 5% utilisation")
    job.refresh_from_db()
    assert (job.state, job.run_class) == (JobState.RUNNING, RunClass.GUARANTEED)

    for _ in range(2):
        reclaim_at(django_capture_on_commit_callbacks, minutes(21))
    job.refresh_from_db()
    assert job.run_class == RunClass.OPPORTUNISTIC and job.state == JobState.RUNNING
    assert len(idle_events(job)) == 2
    assert commands(redis_client, "a1") == []  # nothing told to the node yet

    for _ in range(2):
        reclaim_at(django_capture_on_commit_callbacks, minutes(31))
    assert len(idle_events(job)) == 3 and idle_events(job)[-1].startswith("Suspended: idle 31 min")
    [(fields, suspend)] = commands(redis_client, "a1")
    assert isinstance(suspend, protocol.SuspendJob) and suspend.job_id == job.pk and suspend.node == "a1"
    assert signing.verify_command(signing.node_key(SECRET, "a1"), fields[b"m"], fields[b"sig"])
    assert not signing.verify_command(signing.node_key(SECRET, "v1"), fields[b"m"], fields[b"sig"])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.allocations.filter(released_at__isnull=True).count() == 2

    JobFactory(gpus=2, tenant=job.tenant, owner=alice)  # someone waits for GPUs (test_idle_requeue_hold.py)
    for _ in range(2):
        taken = reclaim_at(django_capture_on_commit_callbacks, minutes(61))
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and job.requeue_count == 1
    assert job.pending_reason["code"] == "idle_requeued"
    assert job.pending_reason["message"].startswith("Requeued by its tenant's idle-GPU policy: idle 61 min")
    assert taken == dict.fromkeys(idle_reclaim.ORDER, 0)  # the second run found nothing to do
    stops = [c for _f, c in commands(redis_client, "a1") if isinstance(c, protocol.StopJob)]
    assert [s.job_id for s in stops] == [job.pk] and stops[0].launch_id == f"launch-{job.pk}-1"
    assert sorted(Notification.objects.filter(job=job).values_list("event", flat=True)) == [
        "idle_demoted", "idle_requeued", "idle_suspended", "idle_warned"]


def test_a_busy_job_is_left_alone(vision, alice, cluster, now, django_capture_on_commit_callbacks, live_redis):
    vision.__dict__.update(POLICY)
    vision.save()
    gpus = [cluster["a1/0"], cluster["a1/1"]]
    job = running_job(vision, alice, gpus, started_at=now - timedelta(minutes=120))
    fill(gpus[:1], now - timedelta(minutes=120), now, 1.0)
    fill(gpus[1:], now - timedelta(minutes=120), now, 60.0)  # one busy GPU keeps the job busy

    assert reclaim_at(django_capture_on_commit_callbacks, now) == dict.fromkeys(idle_reclaim.ORDER, 0)
    job.refresh_from_db()
    assert (job.state, job.run_class, idle_events(job)) == (JobState.RUNNING, RunClass.GUARANTEED, [])
    assert idle_reclaim.idle_state(job) is None


def test_busy_again_starts_a_new_spell(idle_job, cluster, now, django_capture_on_commit_callbacks):
    job, idle_from = idle_job
    reclaim_at(django_capture_on_commit_callbacks, idle_from + timedelta(minutes=11))
    assert len(idle_events(job)) == 1
    # Busy for a minute 40 min into the spell: the warning comes again 10 min after it, not before.
    GpuRollup.objects.filter(gpu=cluster["a1/1"], bucket_start=idle_from + timedelta(minutes=40)).update(util_max=70.0)
    reclaim_at(django_capture_on_commit_callbacks, idle_from + timedelta(minutes=45))
    assert len(idle_events(job)) == 1
    reclaim_at(django_capture_on_commit_callbacks, idle_from + timedelta(minutes=51))
    assert len(idle_events(job)) == 2 and idle_events(job)[-1].startswith("Warned: idle 10 min")


def test_missing_metrics_are_not_idleness(vision, alice, cluster, now, django_capture_on_commit_callbacks, live_redis):
    vision.__dict__.update(POLICY)
    vision.save()
    job = running_job(vision, alice, [cluster["a1/0"]], started_at=now - timedelta(minutes=120))
    fill([cluster["a1/0"]], now - timedelta(minutes=120), now - timedelta(minutes=100), 1.0)  # then silence

    assert reclaim_at(django_capture_on_commit_callbacks, now) == dict.fromkeys(idle_reclaim.ORDER, 0)
    assert idle_events(job) == []


def test_a_policy_less_tenant_and_other_tenants_jobs_are_untouched(idle_job, nlp, charlie, cluster, now,
                                                                   django_capture_on_commit_callbacks, redis_client):
    job, idle_from = idle_job
    # charlie's job in nlp (no policy) is as idle as alice's, on the other node.
    other = running_job(nlp, charlie, [cluster["v1/0"]], started_at=now - timedelta(minutes=150))
    fill([cluster["v1/0"]], now - timedelta(minutes=150), now, 0.0)
    JobFactory(gpus=1, tenant=nlp, owner=charlie)  # someone waits for GPUs: the requeue step is taken

    taken = reclaim_at(django_capture_on_commit_callbacks, now)
    assert taken == dict.fromkeys(idle_reclaim.ORDER, 1)
    other.refresh_from_db()
    assert (other.state, other.run_class, idle_events(other)) == (JobState.RUNNING, RunClass.GUARANTEED, [])
    assert commands(redis_client, "v1") == []
    assert idle_reclaim.idle_state(other) is None
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING


def test_the_beat_task_does_nothing_without_a_policy(vision, alice, cluster, now, live_redis):
    job = running_job(vision, alice, [cluster["a1/0"]], started_at=now - timedelta(days=1))
    fill([cluster["a1/0"]], now - timedelta(hours=3), now, 0.0)
    assert reclaim_idle_gpus() == dict.fromkeys(idle_reclaim.ORDER, 0)
    job.refresh_from_db()
    assert (job.state, job.run_class) == (JobState.RUNNING, RunClass.GUARANTEED)


def test_the_page_and_api_show_the_upcoming_steps(idle_job, alice, bob, charlie, web, api, now):
    job, idle_from = idle_job
    # Idle 22 min by now, and the beat has not run yet: the steps already due say so.
    GpuRollup.objects.filter(bucket_start__lt=now - timedelta(minutes=22)).update(util_max=90.0)
    page = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert ("Idle for 22 min; at 10 min its owner is warned (due now), at 20 min it becomes opportunistic "
            "(preemptible) (due now), at 30 min it is suspended (GPU memory stays held), at 60 min it is requeued."
            ) in page

    reclaim_idle_gpus()  # the beat: warned and made opportunistic
    page = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert ("Idle for 22 min; at 30 min it is suspended (GPU memory stays held), at 60 min it is requeued.") in page

    idle = api(bob).get(f"/api/v1/jobs/{job.pk}/").json()["idle"]
    assert idle["next_step"] == "suspend" and idle["minutes"] == pytest.approx(22, abs=0.5)
    assert idle["done"] == ["notify", "opportunistic"]
    assert [(u["step"], u["minutes"]) for u in idle["upcoming"]] == [("suspend", 30), ("requeue", 60)]
    next_at = datetime.fromisoformat(idle["next_at"].replace("Z", "+00:00"))
    assert abs(next_at - (now + timedelta(minutes=8))) <= timedelta(seconds=10)  # 30 min into a spell 22 min old
    assert api(charlie).get(f"/api/v1/jobs/{job.pk}/").status_code == 404


def test_the_page_says_nothing_of_a_busy_job(vision, alice, cluster, now, web, api):
    vision.__dict__.update(POLICY)
    vision.save()
    job = running_job(vision, alice, [cluster["a1/0"]], started_at=now - timedelta(minutes=60))
    fill([cluster["a1/0"]], now - timedelta(minutes=60), now, 50.0)
    assert "Idle for" not in web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert api(alice).get(f"/api/v1/jobs/{job.pk}/").json()["idle"] is None


@pytest.mark.parametrize("policy, field", [
    (dict(idle_notify_minutes=30, idle_opportunistic_minutes=20), "idle_opportunistic_minutes"),
    (dict(idle_suspend_minutes=30), "idle_requeue_minutes"),
])
def test_a_policy_out_of_order_is_refused(vision, policy, field):
    vision.__dict__.update(policy)
    with pytest.raises(ValidationError) as refused:
        vision.full_clean()
    assert field in refused.value.message_dict


def test_operators_set_the_policy_in_the_admin(vision, operator, web):
    page = web(operator).get(f"/admin/jobs/tenant/{vision.pk}/change/").content.decode()
    assert "Idle GPUs" in page and 'name="idle_suspend_minutes"' in page


def test_a_real_agent_suspends_then_requeues_the_idle_job(idle_job, redis_client, redis_url, tmp_path,
                                                          django_capture_on_commit_callbacks):
    """End to end with a real agent holding a1's key: the suspend stops the job's process (SIGSTOP),
    the requeue ends it, and its exit puts the job back in the queue."""
    job, idle_from = idle_job
    runner = JobRunner(tmp_path / "agent", duty_period=0.5, run_as=RunAsPolicy(allow_root=True))
    agent = Agent("a1", SimulatedBackend("2xT4-16GB", "a1"), redis_url, runner, interval=0.1, heartbeat_ttl=5,
                  shutdown_grace=1, key=signing.node_key(SECRET, "a1"))
    halt = threading.Event()
    thread = threading.Thread(target=agent.run, args=(halt,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: events(redis_client, "node_registered"))
        send_launch("a1", job.pk, python("import time\nwhile True: time.sleep(0.05)"), (0, 1), attempt=1)
        [started] = wait_for(lambda: [e for e in events(redis_client, "job_started") if e.job_id == job.pk])

        reclaim_at(django_capture_on_commit_callbacks, idle_from + timedelta(minutes=31))
        wait_for(lambda: status(started.pid) == psutil.STATUS_STOPPED)
        assert runner.duty_cycle(job.pk) == 0.0

        JobFactory(gpus=1, tenant=job.tenant)  # someone waits for GPUs: the requeue step is taken
        reclaim_at(django_capture_on_commit_callbacks, idle_from + timedelta(minutes=61))
        [exited] = wait_for(lambda: [e for e in events(redis_client, "job_exited") if e.job_id == job.pk], timeout=15)
        assert exited.stopped and exited.launch_id == f"launch-{job.pk}-1"
        assert redis_client.xlen(protocol.DEAD_LETTER_STREAM) == 0
        with django_capture_on_commit_callbacks(execute=True):
            consume_events(redis_client)
    finally:
        halt.set()
        thread.join(10)
        runner.close()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.allocations.filter(released_at__isnull=True).count() == 0
    assert job.events.filter(kind=JobEventKind.REQUEUED).exists()


@pytest.mark.parametrize("policy, preempted", [({}, "busy"), (dict(idle_opportunistic_minutes=20), "idle")])
def test_an_idle_job_made_opportunistic_is_what_the_scheduler_reclaims(
        policy, preempted, db, redis_client, live_redis, django_capture_on_commit_callbacks):
    """Through the real scheduling loop. ``borrowers`` (owed 2 GPUs) holds 4 of n1's: a guaranteed
    job idle for 40 min and an opportunistic one busy for 3 h. ``owed`` needs 2 GPUs of its own
    guarantee: the scheduler reclaims them from the borrower's opportunistic work. Without a policy
    that is the busy job (the only one it may take); once the policy made the idle job
    opportunistic, it is the idle one (youngest, least work lost), and the busy job runs on."""
    capture = django_capture_on_commit_callbacks
    node = NodeFactory(name="n1")
    gpus = [GpuFactory(node=node, index=i) for i in range(4)]
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    now = timezone.now()
    borrowers = TenantFactory(slug="borrowers", guaranteed_gpus=2, max_gpus=4, **policy)
    owner = UserFactory(username="dana")
    jobs = {"idle": running_job(borrowers, owner, gpus[:2], started_at=now - timedelta(minutes=40)),
            "busy": running_job(borrowers, owner, gpus[2:], run_class=RunClass.OPPORTUNISTIC,
                                started_at=now - timedelta(hours=3))}
    fill(gpus[:2], now - timedelta(minutes=40), now, 0.0)
    fill(gpus[2:], now - timedelta(minutes=40), now, 95.0)
    owed = JobFactory(gpus=2, tenant=TenantFactory(slug="owed", guaranteed_gpus=2, max_gpus=2))

    with capture(execute=True):
        reclaim_idle_gpus()
        run_scheduling_cycle()
    states = {name: Job.objects.get(pk=job.pk).state for name, job in jobs.items()}
    assert states == {name: JobState.PREEMPTING if name == preempted else JobState.RUNNING for name in jobs}
    owed.refresh_from_db()
    assert owed.state == JobState.PENDING and owed.pending_reason["code"] == "reclaiming"
