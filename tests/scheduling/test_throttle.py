"""Throttling: AIMD on opportunistic duty cycles from live utilisation (AntMan computation scaling)."""

import pytest

from jobs.scheduling import SchedulerConfig, ThrottleReason, decide
from tests.scheduling.builders import cluster, node, running, tenant

TENANTS = [tenant("owner", guaranteed=4), tenant("borrower")]


def throttled(gpu_util, guaranteed=None, duty=1.0, config=None, **borrower):
    """One GPU with a borrower and (unless ``guaranteed`` is False) a guaranteed neighbour."""
    residents = [running(2, tenant="borrower", opportunistic=True, mem_gib=10, duty=duty, **borrower)]
    if guaranteed is not False:
        residents.append(running(1, tenant="owner", mem_gib=10, **(guaranteed or {})))
    snapshot = cluster(node("a", gpus=1, util=gpu_util), tenants=TENANTS, running=residents)
    decisions = decide(snapshot, now=0, config=config or SchedulerConfig())
    return {t.job_id: (t.duty_cycle, t.reason) for t in decisions.throttles}


@pytest.mark.parametrize("gpu_util, guaranteed, duty, expected", [
    # guaranteed neighbour slowed below its solo profile by more than the margin: halve
    (0.6, dict(util=0.4, solo=0.7), 1.0, (0.5, ThrottleReason.NEIGHBOUR_SLOWED)),
    (0.6, dict(util=0.4, solo=0.7), 0.15, (0.1, ThrottleReason.NEIGHBOUR_SLOWED)),  # floor
    # at the floor and still in the way: suspended (its memory stays, its compute is freed)
    (0.6, dict(util=0.4, solo=0.7), 0.1, (0.0, ThrottleReason.NEIGHBOUR_SLOWED)),
    (0.97, dict(util=0.63, solo=0.65), 0.1, (0.0, ThrottleReason.GPU_SATURATED)),
    # suspended, and the GPU has room again: back at the floor's level
    (0.5, dict(util=0.49, solo=0.5), 0.0, (0.1, ThrottleReason.ROOM_AVAILABLE)),
    # saturated GPU with a guaranteed job on it: halve
    (0.97, dict(util=0.63, solo=0.65), 0.8, (0.4, ThrottleReason.GPU_SATURATED)),
    # the margins are fractions of the neighbour's solo profile: at 10% utilisation alone, 9% is
    # 10% slower (in utilisation points a 0.05 margin let such a job run at half its speed)
    (0.3, dict(util=0.09, solo=0.1), 0.5, (0.25, ThrottleReason.NEIGHBOUR_SLOWED)),
    # room again: add 0.1, up to the ceiling
    (0.5, dict(util=0.49, solo=0.5), 0.5, (0.6, ThrottleReason.ROOM_AVAILABLE)),
    (0.5, dict(util=0.49, solo=0.5), 0.95, (1.0, ThrottleReason.ROOM_AVAILABLE)),
    (0.5, None, 0.3, (0.4, ThrottleReason.ROOM_AVAILABLE)),
    # no guaranteed neighbour at all (it left): straight back to full speed, even without a reading
    (None, False, 0.5, (1.0, ThrottleReason.NO_GUARANTEED_NEIGHBOUR)),
    (0.19, False, 0.0, (1.0, ThrottleReason.NO_GUARANTEED_NEIGHBOUR)),
])
def test_duty_cycle_moves_by_aimd(gpu_util, guaranteed, duty, expected):
    new_duty, reason = throttled(gpu_util, guaranteed, duty)[2]
    assert (new_duty, reason) == (pytest.approx(expected[0]), expected[1])


@pytest.mark.parametrize("gpu_util, guaranteed, duty", [
    (None, None, 0.5),                                # no reading next to guaranteed work: hold
    (0.9, dict(util=0.69, solo=0.7), 0.5),            # busy but not saturated, neighbour fine: hold
    (0.5, dict(util=0.49, solo=0.5), 1.0),            # already at the ceiling
    (0.6, dict(util=0.4, solo=0.7), 0.0),             # already suspended
    (None, None, 0.0),                                # suspended, no reading: hold
    (0.6, dict(util=0.67, solo=0.7), 0.5),            # neighbour in the dead band (4% slower): hold
    (0.3, dict(util=0.097, solo=0.1), 0.5),           # the same band at 10% utilisation alone
])
def test_duty_cycle_is_left_alone(gpu_util, guaranteed, duty):
    assert throttled(gpu_util, guaranteed, duty) == {}


def test_without_suspend_at_floor_the_floor_is_as_low_as_it_goes():
    assert throttled(0.6, dict(util=0.4, solo=0.7), 0.1, config=SchedulerConfig(suspend_at_floor=False)) == {}


def test_guaranteed_jobs_are_never_throttled():
    snapshot = cluster(node("a", gpus=1, util=0.99), tenants=TENANTS,
                       running=[running(1, tenant="owner", mem_gib=10, util=0.2, solo=0.9, duty=0.5)])
    assert decide(snapshot, now=0).throttles == ()


def test_job_on_several_gpus_slows_if_any_gpu_says_so():
    snapshot = cluster(node("a", gpus=2, util={0: 0.5, 1: 0.99}), tenants=TENANTS,
                       running=[running(2, gpus=[0, 1], tenant="borrower", opportunistic=True, mem_gib=10, duty=1.0),
                                running(1, gpus=[1], tenant="owner", mem_gib=10)])
    (throttle,) = decide(snapshot, now=0).throttles
    assert (throttle.job_id, throttle.duty_cycle, throttle.reason) == (2, 0.5, ThrottleReason.GPU_SATURATED)


def test_floor_and_steps_come_from_config():
    config = SchedulerConfig(duty_cycle_floor=0.3, duty_cycle_decrease_factor=0.25, duty_cycle_increase=0.2)
    snapshot = cluster(node("a", gpus=1, util=0.99), tenants=TENANTS,
                       running=[running(2, tenant="borrower", opportunistic=True, mem_gib=10, duty=0.8),
                                running(1, tenant="owner", mem_gib=10)])
    assert decide(snapshot, now=0, config=config).throttles[0].duty_cycle == 0.3


# -- the review's symptom: a throttled borrower left slow after its neighbour went ----------------

def test_a_throttled_job_is_back_at_full_speed_soon_after_its_neighbour_leaves():
    """'7 A100s sat at 19% for minutes while 13 GPUs were idle': borrowers squeezed next to
    guaranteed jobs were not raised again once those left. Closed loop over cycles: the GPU reads
    the sum of its residents' use; the neighbour is cancelled, winds down for a while (still
    holding its GPU, using little), then is gone. The borrowers must not be cut for a neighbour on
    its way out, and must be at full speed within a couple of cycles of it leaving."""
    borrowers = range(1, 8)
    duty = dict.fromkeys(borrowers, 0.19)
    owner_util = {i: 0.8 for i in borrowers}  # guaranteed neighbours, 100 + i, busy at 80%
    history = []
    for cycle in range(12):
        stopping, gone = cycle >= 2, cycle >= 6  # cancelled at cycle 2, its exit confirmed at cycle 6
        if stopping:
            owner_util = dict.fromkeys(borrowers, 0.02)  # saving and exiting
        util = {i - 1: (0 if gone else owner_util[i]) + 0.6 * duty[i] for i in borrowers}
        util.update({i: 0.0 for i in range(7, 20)})  # 13 idle GPUs
        residents = [running(i, gpus=[i - 1], tenant="borrower", opportunistic=True, mem_gib=10, duty=duty[i],
                             util=0.6 * duty[i]) for i in borrowers]
        if not gone:
            residents += [running(100 + i, gpus=[i - 1], tenant="owner", mem_gib=10, util=owner_util[i], solo=0.8,
                                  preempting=stopping) for i in borrowers]
        snapshot = cluster(node("a", gpus=20, util=util), tenants=[tenant("owner", guaranteed=8), tenant("borrower")],
                           running=residents)
        for throttle in decide(snapshot, now=cycle * 2.0).throttles:
            duty[throttle.job_id] = throttle.duty_cycle
        history.append(min(duty.values()))
    assert min(history[2:]) >= 0.19, history  # never cut for a neighbour on its way out
    assert history[3] == 1.0, history  # the cycle after it was told to stop: nothing left to protect


# -- least served first among borrowers sharing a saturated GPU ---------------------------------------

def shared_by_borrowers(gpu_util, duties, config=None):
    """One GPU shared by two borrowers of one tenant: 2 started at 100 s, 3 (the newcomer) at 500 s,
    each at its duty cycle with a live use of 0.5 x it."""
    residents = [running(job_id, tenant="borrower", opportunistic=True, mem_gib=10, duty=duty, util=0.5 * duty,
                         started_at=started) for (job_id, started), duty in zip(((2, 100.0), (3, 500.0)), duties)]
    snapshot = cluster(node("a", gpus=1, util=gpu_util), tenants=TENANTS, running=residents)
    decisions = decide(snapshot, now=600, config=config or SchedulerConfig())
    return {t.job_id: (t.duty_cycle, t.reason) for t in decisions.throttles}


def test_borrowers_saturating_a_gpu_yield_to_the_least_served_one():
    # Both at full speed on a saturated GPU: the one running longer yields, the newcomer runs on.
    assert shared_by_borrowers(1.0, (1.0, 1.0)) == {2: (0.6, ThrottleReason.GPU_SATURATED)}
    # Yielded, it stays so while the GPU would saturate with it back at full speed (0.8 + 0.3 x
    # (1 / 0.6 - 1) = 1.0), rather than go up and be cut again every other cycle.
    assert shared_by_borrowers(0.8, (0.6, 1.0)) == {}
    # A GPU with room for both at full speed: back to full speed.
    assert shared_by_borrowers(0.5, (0.6, 1.0)) == {2: (1.0, ThrottleReason.NO_GUARANTEED_NEIGHBOUR)}
    # Off: both stay at full speed however saturated (AIMD only protects guaranteed neighbours).
    assert shared_by_borrowers(1.0, (1.0, 1.0), SchedulerConfig(borrower_yield_duty=0)) == {}


def test_a_borrower_with_earlier_service_yields_even_to_an_older_run():
    """The order is least attained service: service from earlier runs first, then the run started
    last, so that it does not swap every cycle as the yielding one's service catches up."""
    residents = [running(2, tenant="borrower", opportunistic=True, mem_gib=10, util=0.5, started_at=100.0),
                 running(3, tenant="borrower", opportunistic=True, mem_gib=10, util=0.5, started_at=500.0,
                         attained=7200.0)]
    snapshot = cluster(node("a", gpus=1, util=1.0), tenants=TENANTS, running=residents)
    throttles = {t.job_id: t.duty_cycle for t in decide(snapshot, now=600).throttles}
    assert throttles == {3: 0.6}
