"""The loop's measure of each running job's service in this run (``jobs.services.service_meter``):
time counted at the speed the job ran, which turnover among borrowers ranks by."""

import dataclasses
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from jobs.choices import JobState, RunClass
from jobs.models import Allocation, JobProfile
from jobs.services import scheduling_loop
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.services import live
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory
from jobs.scheduling.snapshot import ClusterSnapshot, JobClass, LiveReadings, RunningJob
from jobs.services import service_meter
from jobs.services.service_meter import ServiceMeter

HOUR = 3600.0


def snapshot(*jobs: RunningJob, live: dict[int, float] | None = None, crowded: bool = True) -> ClusterSnapshot:
    """The running ``jobs``; ``crowded``: with a guaranteed job on GPUs 0 and 1 beside them."""
    neighbour = RunningJob(id=99, tenant="vision", job_class=JobClass.GUARANTEED, gpu_ids=(0, 1), started_at=0.0)
    running = (*jobs, neighbour) if crowded else jobs
    return ClusterSnapshot(nodes=(), pending=(), running=running, readings=LiveReadings(jobs=live or {}))


def borrower(job_id=1, started_at=0.0, **fields) -> RunningJob:
    spec = dict(tenant="nlp", job_class=JobClass.OPPORTUNISTIC, gpu_ids=(0,), started_at=started_at,
                solo_utilisation=0.8, checkpoints=True)
    spec.update(fields)
    return RunningJob(id=job_id, **spec)


def served_after(meter: ServiceMeter, steps: list[tuple[float, RunningJob, float | None]]) -> float:
    """The service the meter hands the core after measuring ``steps`` (time, job, live utilisation)."""
    for now, job, reading in steps:
        measured = meter.measured(snapshot(job, live=None if reading is None else {job.id: reading}), now)
    return measured.readings.served_gpu_s[job.id]


def cycles(job: RunningJob, live: float | None, start: float = 0.0, hours: float = 1.0) -> list[tuple]:
    """A cycle a minute from ``start`` for ``hours``, ``job`` read at ``live`` each time."""
    return [(start + minute * 60.0, job, live) for minute in range(int(hours * 60) + 1)]


def test_a_job_crowded_to_a_quarter_of_its_solo_speed_is_served_a_quarter_of_the_time():
    assert served_after(ServiceMeter(), cycles(borrower(), 0.2, hours=2)) == pytest.approx(0.5 * HOUR)


def test_without_a_profile_or_a_reading_the_duty_cycle_is_the_speed():
    no_profile = borrower(solo_utilisation=None, duty_cycle=0.25)
    assert served_after(ServiceMeter(), cycles(no_profile, 0.9)) == pytest.approx(0.25 * HOUR)
    assert served_after(ServiceMeter(), cycles(borrower(duty_cycle=0.5), None)) == pytest.approx(0.5 * HOUR)
    assert served_after(ServiceMeter(), cycles(borrower(duty_cycle=0.0), 0.8)) == 0.0


def test_alone_and_not_throttled_a_job_reading_below_its_profile_has_had_the_time_it_held():
    # (nothing the scheduler did slows it: counted at its reading, running slow on purpose would
    # keep its GPU from turnover)
    job = borrower()
    meter = ServiceMeter()
    for now, _, reading in cycles(job, 0.2):
        measured = meter.measured(snapshot(job, live={1: reading}, crowded=False), now)
    assert measured.readings.served_gpu_s[1] == pytest.approx(HOUR)
    throttled = borrower(duty_cycle=0.5)
    meter = ServiceMeter()
    for now, _, reading in cycles(throttled, 0.2):
        measured = meter.measured(snapshot(throttled, live={1: reading}, crowded=False), now)
    assert measured.readings.served_gpu_s[1] == pytest.approx(0.25 * HOUR)


def test_a_half_gpu_counts_half_and_a_reading_past_solo_counts_full_speed():
    assert served_after(ServiceMeter(), cycles(borrower(gpu_milli=500), 0.8)) == pytest.approx(0.5 * HOUR)
    assert served_after(ServiceMeter(), cycles(borrower(gpu_ids=(0, 1)), 0.95)) == pytest.approx(2 * HOUR)


def test_a_run_first_seen_counts_the_time_before_as_held_and_a_new_run_starts_again():
    meter = ServiceMeter()
    job = borrower(started_at=0.0)
    # First seen an hour in (a new leader): that hour counts whole; the next at a quarter.
    assert served_after(meter, cycles(job, 0.2, start=HOUR)) == pytest.approx(1.25 * HOUR)
    requeued = dataclasses.replace(job, started_at=3 * HOUR)  # (preempted and placed again)
    assert served_after(meter, [(3 * HOUR, requeued, 0.2)]) == 0.0


def test_a_gap_between_two_measured_cycles_counts_as_held(monkeypatch):
    job = borrower()
    gap = service_meter.MAX_GAP_S + 60.0
    assert served_after(ServiceMeter(), [(0.0, job, 0.2), (gap, job, 0.2)]) == pytest.approx(gap)
    monkeypatch.setattr(service_meter, "MAX_GAP_S", 2 * gap)
    assert served_after(ServiceMeter(), [(0.0, job, 0.2), (gap, job, 0.2)]) == pytest.approx(gap / 4)


def test_between_two_measures_a_job_runs_on_at_the_speed_read_last():
    meter = ServiceMeter()
    job = borrower()
    meter.measured(snapshot(job, live={1: 0.8}), 0.0)
    meter.measured(snapshot(job, live={1: 0.8}), 60.0)  # (a minute at full speed)
    every = service_meter.MEASURE_EVERY_S
    # Cycles 2 s apart, crowded to a quarter speed from here: read again a measure's period on.
    between = meter.measured(snapshot(job, live={1: 0.2}), 60.0 + every - 2).readings.served_gpu_s
    assert between[1] == pytest.approx(60.0 + every - 2)
    after = meter.measured(snapshot(job, live={1: 0.2}), 60.0 + every).readings.served_gpu_s
    assert after[1] == pytest.approx(60.0 + every / 4)


def test_only_borrowers_that_checkpoint_are_measured_and_those_that_stopped_are_forgotten():
    meter = ServiceMeter()
    guaranteed = borrower(3, job_class=JobClass.GUARANTEED)
    meter.measured(snapshot(borrower(1), borrower(2), guaranteed, borrower(4, checkpoints=False)), 0.0)
    assert set(meter.measured(snapshot(borrower(2), guaranteed), 60.0).readings.served_gpu_s) == {2}


# -- through the scheduling loop ------------------------------------------------------------------

class _LaterClock:
    """The loop's clock, ``ahead`` seconds past the real one (a cycle an hour later, now)."""

    def __init__(self):
        self.ahead = 0.0

    def time(self):
        return time.time() + self.ahead

    def perf_counter(self):
        return time.perf_counter()


@pytest.mark.parametrize("live_util_sm, turned_over", [(20.0, False), (80.0, True)])
def test_the_loop_turns_over_a_borrower_by_the_service_it_had_not_the_time_it_held(
        db, redis_client, live_redis, monkeypatch, django_capture_on_commit_callbacks, live_util_sm, turned_over):
    """A borrower that has held a GPU 90 minutes beside another, the last hour at a quarter of its
    solo speed, has had 45 minutes: a fresh borrower over-commits their GPU instead of preempting
    both. At full speed it had 90 minutes, and both are preempted."""
    clock = _LaterClock()
    monkeypatch.setattr(scheduling_loop, "time", clock)
    monkeypatch.setattr(scheduling_loop, "_service", ServiceMeter())
    monkeypatch.setattr(service_meter, "MAX_GAP_S", 2 * HOUR)  # (two cycles an hour apart, measured)
    node = NodeFactory(name="n1")
    gpu = GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    old = TenantFactory(slug="old", guaranteed_gpus=0, max_gpus=4)
    new = TenantFactory(slug="new", guaranteed_gpus=0, max_gpus=4)
    JobProfile.objects.create(tenant=old, key="train", peak_gpu_memory_mib=1000, mean_util=0.8)
    victim = JobFactory(tenant=old, gpus=1, gpu_memory_mib=1000, checkpoints=True, profile_key="train",
                        state=JobState.RUNNING, run_class=RunClass.OPPORTUNISTIC,
                        started_at=timezone.now() - timedelta(minutes=30))
    Allocation.objects.create(job=victim, gpu=gpu, attempt=victim.attempt)
    beside = JobFactory(tenant=old, gpus=1, gpu_memory_mib=1000, checkpoints=True, state=JobState.RUNNING,
                        run_class=RunClass.OPPORTUNISTIC, started_at=timezone.now() - timedelta(hours=3))
    Allocation.objects.create(job=beside, gpu=gpu, attempt=beside.attempt)

    def read(util_sm):
        live.store_latest(redis_client, [protocol.NodeSample(
            node="n1", ts=time.time(), seq=int(clock.ahead) + 1,
            gpus=[protocol.GpuSample(index=0, util_sm=util_sm + 10.0)],
            jobs=[protocol.JobGpuSample(job_id=victim.pk, gpu_index=0, mem_used_mib=900, util_sm=util_sm),
                  protocol.JobGpuSample(job_id=beside.pk, gpu_index=0, mem_used_mib=900, util_sm=10.0)])])

    read(live_util_sm)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()  # (first seen 30 minutes in: those count as held)
    fresh = JobFactory(tenant=new, gpus=1, gpu_memory_mib=1000, checkpoints=True)
    clock.ahead = HOUR
    read(live_util_sm)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    victim.refresh_from_db()
    fresh.refresh_from_db()
    assert (victim.state != JobState.RUNNING) is turned_over, victim.state
    assert (fresh.state == JobState.PLACED) is not turned_over, fresh.pending_reason
