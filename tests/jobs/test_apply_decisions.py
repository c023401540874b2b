"""The loop carries out every kind of decision: placement with its limits and environment,
reclaim by preemption (requeued when the agent confirms), throttling, profiles and re-sends."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import RunClass, JobState
from jobs.models import Allocation, JobProfile, JobPromise
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.models import JobUsage
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory


@pytest.fixture
def node4(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    for i in range(4):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def commands(redis_client, node="n1"):
    return [protocol.decode_command(f) for _, f in redis_client.xrange(protocol.command_stream(node))]


def cycle(capture):
    with capture(execute=True):
        return run_scheduling_cycle()


def exit_event(redis_client, job, code=0, stopped=False, node="n1"):
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
        node=node, job_id=job.pk, exit_code=code, stopped=stopped, finished_at=time.time())))
    consume_events(redis_client)


def test_launch_carries_the_jobs_env_class_attempt_and_runtime_limit(node4, redis_client,
                                                                     django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1, env={"EPOCHS": "3"}, tenant=TenantFactory(slug="vision", guaranteed_gpus=2),
                     max_runtime_s=90)
    cycle(django_capture_on_commit_callbacks)
    (launch,) = commands(redis_client)
    assert launch.env["EPOCHS"] == "3"
    assert launch.tenant == job.tenant.slug  # the agent's --run-as-tenant picks the account from it
    assert launch.command_id == f"launch-{job.pk}-1"  # the first placement is attempt 1
    assert launch.max_runtime_s == 90  # the node enforces it
    job.refresh_from_db()
    assert job.run_class == RunClass.GUARANTEED and job.attempt == 1


def test_over_guarantee_work_runs_opportunistic(node4, django_capture_on_commit_callbacks):
    borrower = TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4)
    job = JobFactory(gpus=2, tenant=borrower)
    cycle(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert (job.state, job.run_class) == (JobState.PLACED, RunClass.OPPORTUNISTIC)


def test_guaranteed_tenant_reclaims_from_a_borrower_who_is_requeued(node4, redis_client,
                                                                    django_capture_on_commit_callbacks):
    borrower = JobFactory(gpus=4, tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4))
    cycle(django_capture_on_commit_callbacks)
    borrower.refresh_from_db()
    assert borrower.run_class == RunClass.OPPORTUNISTIC
    owed = JobFactory(gpus=4, tenant=TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=4))
    cycle(django_capture_on_commit_callbacks)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PREEMPTING and borrower.preempt_count == 1
    assert [c.job_id for c in commands(redis_client) if isinstance(c, protocol.StopJob)] == [borrower.pk]
    # The agent confirms; the borrower is queued again and the owed job takes the GPUs.
    exit_event(redis_client, borrower, code=-15, stopped=True)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PENDING
    cycle(django_capture_on_commit_callbacks)
    owed.refresh_from_db()
    assert (owed.state, owed.run_class) == (JobState.PLACED, RunClass.GUARANTEED)
    relaunch = JobFactory._meta.model.objects.get(pk=borrower.pk)
    assert relaunch.state == JobState.PENDING


def test_the_gpus_a_reclaim_frees_are_kept_for_the_job_they_were_freed_for(node4, redis_client,
                                                                          django_capture_on_commit_callbacks):
    borrowing = TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4)
    borrowers = [JobFactory(gpus=1, tenant=borrowing) for _ in range(4)]
    cycle(django_capture_on_commit_callbacks)
    owed = JobFactory(gpus=1, tenant=TenantFactory(slug="vision", guaranteed_gpus=1, max_gpus=1))
    cycle(django_capture_on_commit_callbacks)
    (victim,) = [job for job in borrowers if type(job).objects.get(pk=job.pk).state == JobState.PREEMPTING]
    freed = Allocation.objects.get(job=victim, released_at__isnull=True).gpu
    assert list(JobPromise.objects.values_list("job_id", "gpu_ids")) == [(owed.pk, [freed.pk])]
    # Garbage in the table (not the loop's) is ignored by the next snapshot, then replaced.
    JobPromise.objects.filter(job=owed).update(gpu_ids=["x", -1])
    cycle(django_capture_on_commit_callbacks)
    owed.refresh_from_db()
    assert owed.state == JobState.PENDING  # the victim is still stopping
    assert list(JobPromise.objects.values_list("job_id", "gpu_ids")) == [(owed.pk, [freed.pk])]
    exit_event(redis_client, victim, code=-15, stopped=True)
    cycle(django_capture_on_commit_callbacks)
    owed.refresh_from_db()
    assert (owed.state, owed.run_class) == (JobState.PLACED, RunClass.GUARANTEED)
    assert Allocation.objects.get(job=owed).gpu == freed
    assert not JobPromise.objects.exists()  # kept: nothing left to keep


def test_throttle_decision_reaches_the_agent(node4, redis_client, django_capture_on_commit_callbacks):
    """A guaranteed job slowed next to a borrower: the borrower's duty cycle is cut."""
    from monitoring.services import live

    guaranteed = JobFactory(gpus=1, gpu_milli=500, shareable=True, gpu_memory_mib=20000,
                            tenant=TenantFactory(slug="vision", guaranteed_gpus=1, max_gpus=1))
    cycle(django_capture_on_commit_callbacks)
    gpu = Allocation.objects.get(job=guaranteed).gpu
    borrower = JobFactory(gpus=1, gpu_milli=500, gpu_memory_mib=20000,
                          tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4))
    # Fill the other GPUs so the borrower can only share the guaranteed job's GPU.
    for other in range(1, 4):
        JobFactory(gpus=1, tenant=guaranteed.tenant, state=JobState.RUNNING)
        Allocation.objects.create(job=JobFactory._meta.model.objects.latest("id"), gpu=node4.gpus.get(index=other))
    JobProfile.objects.create(tenant=guaranteed.tenant, key="solo", peak_gpu_memory_mib=1000, mean_util=0.5)
    type(guaranteed).objects.filter(pk=guaranteed.pk).update(profile_key="solo", state=JobState.RUNNING)
    cycle(django_capture_on_commit_callbacks)
    borrower.refresh_from_db()
    assert borrower.state == JobState.PLACED, borrower.pending_reason
    assert Allocation.objects.get(job=borrower).gpu == gpu
    # Live usage: the guaranteed job runs far below its solo profile while the GPU is saturated.
    live.store_latest(redis_client, [protocol.NodeSample(
        node="n1", ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=gpu.index, util_sm=99.0)],
        jobs=[protocol.JobGpuSample(job_id=guaranteed.pk, gpu_index=gpu.index, mem_used_mib=900, util_sm=30.0),
              protocol.JobGpuSample(job_id=borrower.pk, gpu_index=gpu.index, mem_used_mib=900, util_sm=59.0)])])
    type(borrower).objects.filter(pk=borrower.pk).update(state=JobState.RUNNING)
    cycle(django_capture_on_commit_callbacks)
    duty = [c for c in commands(redis_client) if isinstance(c, protocol.SetDutyCycle)]
    assert duty and duty[-1].job_id == borrower.pk and duty[-1].duty_cycle < 1.0
    assert Allocation.objects.get(job=borrower).duty_cycle == duty[-1].duty_cycle


def test_successful_run_records_the_profile_used_next_time(node4, redis_client, django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1, profile_key="resnet50", gpu_memory_mib=40000)
    cycle(django_capture_on_commit_callbacks)
    now = timezone.now()
    JobUsage.objects.create(job_id=job.pk, peak_gpu_memory_mib=9000, util_sum=70.0 * 10, util_n=10,
                            first_seen_at=now, last_seen_at=now)
    type(job).objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=now - timedelta(seconds=100))
    exit_event(redis_client, job)
    profile = JobProfile.objects.get(key="resnet50")
    assert (profile.runs, profile.peak_gpu_memory_mib, profile.mean_util) == (1, 9000, 0.7)
    job.refresh_from_db()
    assert job.peak_gpu_memory_mib == 9000


def test_unstarted_launch_is_sent_again_with_the_same_command_id(node4, redis_client,
                                                                   django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    type(job).objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(minutes=1))
    cycle(django_capture_on_commit_callbacks)
    cycle(django_capture_on_commit_callbacks)  # not again within the window
    launches = [c for c in commands(redis_client) if isinstance(c, protocol.LaunchJob)]
    assert [c.command_id for c in launches] == [f"launch-{job.pk}-1"] * 2


def test_re_sent_launch_of_a_gang_keeps_its_rendezvous_environment(node4, redis_client,
                                                                    django_capture_on_commit_callbacks):
    job = JobFactory(gpus=2, env={"EPOCHS": "3"})
    cycle(django_capture_on_commit_callbacks)
    type(job).objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(minutes=1))
    cycle(django_capture_on_commit_callbacks)
    first, again = [c for c in commands(redis_client) if isinstance(c, protocol.LaunchJob)]
    assert again.command_id == first.command_id and again.gpu_indices == first.gpu_indices
    assert again.env == first.env
    assert {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"} <= set(again.env)
    assert again.env["WORLD_SIZE"] == "2" and again.env["EPOCHS"] == "3"


def test_a_lost_stop_is_sent_again_while_the_job_is_still_stopping(node4, redis_client,
                                                                     django_capture_on_commit_callbacks, settings):
    from jobs.services.submission import cancel_job

    job = JobFactory(gpus=1)
    cycle(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        cancel_job(job)
    redis_client.delete(protocol.command_stream("n1"))  # the stop is lost with Redis
    cycle(django_capture_on_commit_callbacks)  # first sighting of the stopping job: too early to resend
    assert commands(redis_client) == []
    settings.COLONY_RESEND_AFTER_S = 0
    cycle(django_capture_on_commit_callbacks)
    (stop,) = commands(redis_client)
    assert isinstance(stop, protocol.StopJob) and stop.job_id == job.pk
    exit_event(redis_client, job, code=-15, stopped=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    cycle(django_capture_on_commit_callbacks)
    assert len(commands(redis_client)) == 1  # settled: nothing more is sent


def test_a_throttle_to_zero_suspends_the_job_and_the_next_one_resumes_it(node4, redis_client,
                                                                           django_capture_on_commit_callbacks):
    from jobs.scheduling.decisions import Decisions, Throttle, ThrottleReason
    from jobs.services.apply import apply_decisions

    borrower = JobFactory(gpus=1, state=JobState.RUNNING, run_class=RunClass.OPPORTUNISTIC)
    Allocation.objects.create(job=borrower, gpu=node4.gpus.get(index=0), duty_cycle=0.1)
    for duty in (0.0, 0.1):
        with django_capture_on_commit_callbacks(execute=True):
            apply_decisions(Decisions(throttles=(Throttle(borrower.pk, duty, ThrottleReason.GPU_SATURATED),)))
    assert Allocation.objects.get(job=borrower).duty_cycle == pytest.approx(0.1)
    sent = [(c.kind, getattr(c, "duty_cycle", None)) for c in commands(redis_client) if c.job_id == borrower.pk]
    assert sent == [("suspend", None), ("set_duty_cycle", 0.1), ("resume", None)]


def test_a_placed_job_suspended_before_it_started_is_relaunched_and_suspended(node4, redis_client):
    from jobs.services.apply import resend_after_s, resend_unstarted_launches

    job = JobFactory(gpus=1, state=JobState.PLACED, placed_at=timezone.now() - timedelta(seconds=resend_after_s() + 1))
    Allocation.objects.create(job=job, gpu=node4.gpus.get(index=0), duty_cycle=0.0)
    assert resend_unstarted_launches(redis_client) == 1
    sent = [(c.kind, getattr(c, "duty_cycle", None)) for c in commands(redis_client) if c.job_id == job.pk]
    assert sent == [("launch", 0.1), ("suspend", None)]


def test_a_command_that_cannot_be_sent_does_not_stop_the_others(db, redis_client, live_redis, caplog,
                                                                django_capture_on_commit_callbacks):
    from django.db import transaction

    from jobs.services.commands import send_stop

    redis_client.set(protocol.command_stream("broken"), "not a stream")  # e.g. a node's ACL gone wrong
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        transaction.on_commit(lambda: send_stop("broken", 1))
        transaction.on_commit(lambda: send_stop("n2", 2))
    assert [c.job_id for c in commands(redis_client, "n2")] == [2]
    assert "could not send stop for job 1 to node broken" in caplog.text


def test_live_job_figures_count_only_from_the_nodes_the_job_runs_on(node4, redis_client):
    from jobs.services.snapshot_loader import build_snapshot
    from monitoring.services import live

    job = JobFactory(gpus=1, state=JobState.RUNNING)
    Allocation.objects.create(job=job, gpu=node4.gpus.get(index=0))
    NodeFactory(name="n2")
    live.store_latest(redis_client, [
        protocol.NodeSample(node="n1", ts=time.time(), seq=1, gpus=[],
                            jobs=[protocol.JobGpuSample(job_id=job.pk, gpu_index=0, mem_used_mib=900, util_sm=80.0)]),
        # Another node says the job idles on it: a bug or a lie, it must not count.
        protocol.NodeSample(node="n2", ts=time.time(), seq=1, gpus=[],
                            jobs=[protocol.JobGpuSample(job_id=job.pk, gpu_index=0, mem_used_mib=1, util_sm=0.0)]),
    ])
    assert build_snapshot(redis_client).readings.jobs[job.pk] == pytest.approx(0.8)
