"""The node's local coordinator on its own: readings in, borrowers' duty cycles out (no agent, no
processes, no clock: each reading comes with its time)."""

from __future__ import annotations

import json

import pytest

from agents import protocol
from agents.local_coordinator import (
    NO_GUARANTEED_NEIGHBOUR,
    ROOM_AVAILABLE,
    SATURATED_BESIDE_GUARANTEED,
    LocalCoordinator,
    Resident,
)

from .helpers import command, launch, python, samples, send, stop, wait_for

BORROWER, GUARANTEED, OTHER = 1, 2, 3


def borrower(job_id=BORROWER, gpus=(0,), floor=0.1, ceiling=1.0) -> Resident:
    return Resident(job_id, "opportunistic", tuple(gpus), floor, ceiling)


def guaranteed(job_id=GUARANTEED, gpus=(0,)) -> Resident:
    return Resident(job_id, "guaranteed", tuple(gpus))


def coordinator(*residents: Resident, **knobs) -> LocalCoordinator:
    coord = LocalCoordinator(**knobs)
    for resident in residents:
        coord.admit(resident)
    return coord


def trajectory(coord: LocalCoordinator, readings, job_id=BORROWER, suspended=()) -> list[float]:
    """The job's duty cycle after each reading; ``readings``: (seconds, {gpu: utilisation}) pairs,
    or a bare utilisation of GPU 0, one a second."""
    duties = []
    for step, reading in enumerate(readings):
        at, utilisation = reading if isinstance(reading, tuple) else (float(step), {0: reading})
        coord.step(at, utilisation, suspended)
        duties.append(coord.duty_cycle(job_id))
    return duties


# (what, residents, readings, the borrower's duty cycle after each)
CASES = [
    ("a saturated GPU beside a guaranteed job cuts the borrower at the first reading",
     [guaranteed(), borrower()], [1.0], [0.5]),
    ("at the threshold counts as saturated", [guaranteed(), borrower()], [0.9], [0.5]),
    ("the guaranteed job first or the borrower first: the same", [borrower(), guaranteed()], [1.0, 1.0], [0.5, 0.25]),
    ("still saturated a second later: cut again, down to the floor and never below",
     [guaranteed(), borrower()], [1.0] * 6, [0.5, 0.25, 0.125, 0.1, 0.1, 0.1]),
    ("a higher floor holds", [guaranteed(), borrower(floor=0.3)], [1.0] * 4, [0.5, 0.3, 0.3, 0.3]),
    ("a reading before the last cut could show holds it",
     [guaranteed(), borrower()], [(0.0, {0: 1.0}), (0.2, {0: 1.0}), (0.6, {0: 1.0}), (1.0, {0: 1.0})],
     [0.5, 0.5, 0.5, 0.25]),
    ("between room and saturated: held (the dead band)", [guaranteed(), borrower()], [1.0, 0.85, 0.85, 0.8],
     [0.5, 0.5, 0.5, 0.5]),
    ("room returns: raised a step a second, up to the ceiling and no further",
     [guaranteed(), borrower(ceiling=0.6)], [1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5],
     [0.3, 0.15, 0.25, 0.35, 0.45, 0.55, 0.6]),
    ("no reading: held", [guaranteed(), borrower()], [1.0, None, None], [0.5, 0.5, 0.5]),
    ("a saturated GPU with no guaranteed job is the borrowers' own business", [borrower(), borrower(OTHER)],
     [1.0, 1.0], [1.0, 1.0]),
    ("a guaranteed job on another GPU protects only its own", [guaranteed(gpus=(1,)), borrower(gpus=(0,))],
     [(0.0, {0: 1.0, 1: 1.0}), (1.0, {0: 1.0, 1: 1.0})], [1.0, 1.0]),
    ("a borrower on two GPUs is cut when either saturates beside a guaranteed job",
     [guaranteed(gpus=(1,)), borrower(gpus=(0, 1))], [(0.0, {0: 0.2, 1: 0.95})], [0.5]),
    ("... and raised only when every such GPU has room",
     [guaranteed(gpus=(0,)), guaranteed(OTHER, gpus=(1,)), borrower(gpus=(0, 1))],
     [(0.0, {0: 1.0, 1: 1.0}), (1.0, {0: 0.5, 1: 0.85}), (2.0, {0: 0.5, 1: 0.5})], [0.5, 0.5, 0.6]),
    ("a launch below the floor is never cut further", [guaranteed(), borrower(ceiling=0.05)], [1.0, 1.0],
     [0.05, 0.05]),
]


@pytest.mark.parametrize(("residents", "readings", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_borrower_duty_cycle_follows_the_gpu_it_shares_with_a_guaranteed_job(residents, readings, expected):
    coord = coordinator(*residents)
    assert trajectory(coord, readings) == pytest.approx(expected)


def test_a_cut_reports_the_reading_that_decided_it_and_never_names_a_guaranteed_job():
    coord = coordinator(guaranteed(), borrower(), Resident(OTHER, None, (0,)))
    [change] = coord.step(0.0, {0: 0.97})
    assert (change.job_id, change.before, change.duty_cycle, change.reason) == (BORROWER, 1.0, 0.5,
                                                                               SATURATED_BESIDE_GUARANTEED)
    assert (change.gpu_index, change.utilisation, change.guaranteed) == (0, 0.97, (GUARANTEED,))
    for at in range(1, 10):  # however long it stays saturated, only the borrower moves
        assert {c.job_id for c in coord.step(float(at), {0: 1.0})} <= {BORROWER}
    assert coord.duty_cycle(GUARANTEED) is None and coord.duty_cycle(OTHER) is None  # (not borrowers: not moved)
    [change] = coord.step(10.0, {0: 0.3})
    assert change.reason == ROOM_AVAILABLE


def test_when_the_guaranteed_job_leaves_the_borrower_goes_back_to_its_ceiling_at_once():
    coord = coordinator(guaranteed(), borrower(ceiling=0.8))
    assert trajectory(coord, [1.0, 1.0]) == [0.4, 0.2]
    coord.forget(GUARANTEED)
    [change] = coord.step(2.0, {0: 0.3})
    assert (change.duty_cycle, change.reason) == (0.8, NO_GUARANTEED_NEIGHBOUR)


def test_a_suspended_guaranteed_job_protects_nothing_and_a_suspended_borrower_is_left_alone():
    coord = coordinator(guaranteed(), borrower())
    coord.step(0.0, {0: 1.0})
    assert coord.duty_cycle(BORROWER) == 0.5
    assert coord.step(1.0, {0: 1.0}, suspended={BORROWER}) == []
    assert coord.duty_cycle(BORROWER) == 0.5
    coord.step(2.0, {0: 1.0}, suspended={GUARANTEED})
    assert coord.duty_cycle(BORROWER) == 1.0


@pytest.mark.parametrize(("neighbour", "held", "ceiling", "runs_at"), [
    (True, 0.25, 0.5, 0.25),   # the node holds it lower than the new ceiling: it stays there
    (True, 0.25, 0.1, 0.1),    # a ceiling under where it is: down to the ceiling at once
    (False, 1.0, 0.3, 0.3),    # nothing to protect: the ceiling is what it runs at
    (False, 0.3, 0.7, 0.7),
])
def test_the_control_planes_duty_cycle_is_the_borrowers_ceiling(neighbour, held, ceiling, runs_at):
    coord = coordinator(borrower(ceiling=held), *([guaranteed()] if neighbour else []))
    assert coord.set_ceiling(BORROWER, ceiling) == runs_at
    assert coord.ceiling(BORROWER) == ceiling
    # However long there is room afterwards, it never runs above the ceiling.
    assert max(trajectory(coord, [(float(t), {0: 0.1}) for t in range(10)])) <= ceiling
    assert coord.duty_cycle(BORROWER) == ceiling


def test_the_ceiling_of_a_job_that_is_no_borrower_is_left_to_the_caller():
    coord = coordinator(guaranteed(), Resident(OTHER, None, (0,)))
    assert coord.set_ceiling(GUARANTEED, 0.5) is None
    assert coord.set_ceiling(OTHER, 0.5) is None
    assert coord.set_ceiling(99, 0.5) is None


@pytest.mark.parametrize("knobs", [dict(room=0.95, saturated=0.9), dict(decrease_factor=1.0), dict(increase=0),
                                   dict(settle_s=-1)])
def test_nonsense_knobs_are_refused(knobs):
    with pytest.raises(ValueError):
        LocalCoordinator(**knobs)


# ---------------------------------------------------------------- what the launch tells the node

LAUNCH = {"v": 1, "kind": "launch", "command_id": "launch-7-1", "job_id": 7, "argv": ["true"], "gpu_indices": [0]}


def test_a_launch_from_a_control_plane_that_does_not_say_the_class_is_still_valid():
    launch_job = protocol.decode_command({"m": json.dumps(LAUNCH)})
    assert (launch_job.job_class, launch_job.duty_cycle_floor) == (None, protocol.DEFAULT_DUTY_CYCLE_FLOOR)


@pytest.mark.parametrize(("field", "value", "valid"), [
    ("job_class", "opportunistic", True),
    ("job_class", "guaranteed", True),
    ("job_class", "admin", False),
    ("duty_cycle_floor", 0.25, True),
    ("duty_cycle_floor", 0, False),
    ("duty_cycle_floor", 1.5, False),
    ("duty_cycle_floor", "NaN", False),
    ("duty_cycle_floor", 1e308 * 10, False),  # Infinity on the wire
])
def test_the_launchs_class_and_floor_are_bounded(field, value, valid):
    raw = json.dumps({**LAUNCH, field: float(value) if value == "NaN" else value})
    if valid:
        assert getattr(protocol.decode_command({"m": raw}), field) == value
    else:
        with pytest.raises(protocol.ProtocolError, match=field):
            protocol.decode_command({"m": raw})


# ---------------------------------------------------------------- driven by a real agent
# A simulated V100 whose two jobs together ask for more than it has (70% + 60%), with nothing
# from the control plane after the launches: the node alone must cut the borrower.

GUARANTEED_LOAD = {"COLONY_SIM_WORKLOAD": "train:mem=8000,util=70,period=5,ramp=0"}
BORROWER_LOAD = {"COLONY_SIM_WORKLOAD": "train:mem=8000,util=60,period=5,ramp=0"}
SLEEPER = "import time; time.sleep(60)"


def _duty_of(sample, job_id):
    running = list(sample.running_jobs)
    return sample.duty_cycles[running.index(job_id)] if job_id in running else None


def _samples_since(client, seq):
    return [s for s in samples(client) if s.seq > seq]


@pytest.mark.parametrize("guaranteed_first", [True, False], ids=["guaranteed-first", "borrower-first"])
def test_the_agent_cuts_a_borrower_beside_a_saturated_guaranteed_job_without_the_control_plane(
        redis_url, redis_client, start_agent, guaranteed_first):
    running = start_agent(redis_url, node="n1", spec="1xV100-32GB", interval=0.2)
    first_class, second_class = ("guaranteed", "opportunistic") if guaranteed_first else ("opportunistic", "guaranteed")
    loads = {"guaranteed": GUARANTEED_LOAD, "opportunistic": BORROWER_LOAD}
    first = launch(python(SLEEPER), gpus=[0], env=loads[first_class], job_class=first_class)
    second = launch(python(SLEEPER), gpus=[0], env=loads[second_class], job_class=second_class)
    guaranteed_job, borrower_job = (first, second) if guaranteed_first else (second, first)
    send(redis_client, "n1", first)
    wait_for(lambda: any(first.job_id in s.running_jobs for s in samples(redis_client)), timeout=15)
    send(redis_client, "n1", second)

    def both_running_and_saturated():
        return next((s for s in samples(redis_client) if {first.job_id, second.job_id} <= set(s.running_jobs)
                     and s.gpus[0].util_sm >= 90), None)

    saturated = wait_for(both_running_and_saturated, timeout=15)

    def cut():
        return next((s for s in _samples_since(redis_client, saturated.seq - 1)
                     if (_duty_of(s, borrower_job.job_id) or 1) < 1), None)

    first_cut = wait_for(cut, timeout=10)
    assert first_cut.ts - saturated.ts < 3.0, (first_cut.ts - saturated.ts)
    # It settles with the GPU no longer saturated, the borrower at or above its floor, and the
    # guaranteed job never throttled.
    settled = wait_for(lambda: next((s for s in _samples_since(redis_client, first_cut.seq)
                                     if s.gpus[0].util_sm < 90), None), timeout=10)
    assert settled.ts - saturated.ts < 5.0
    after = _samples_since(redis_client, saturated.seq - 1)
    assert all(_duty_of(s, guaranteed_job.job_id) in (None, 1.0) for s in after)
    assert min(_duty_of(s, borrower_job.job_id) for s in after
               if _duty_of(s, borrower_job.job_id) is not None) >= 0.1
    assert running.agent.local_duty_changes >= 1


def test_a_borrower_whose_launch_names_no_class_is_left_to_the_control_plane(redis_url, redis_client, start_agent):
    """As before this change: a launch from a control plane that does not say the job's class."""
    start_agent(redis_url, node="n1", spec="1xV100-32GB", interval=0.2)
    guaranteed_job = launch(python(SLEEPER), gpus=[0], env=GUARANTEED_LOAD, job_class="guaranteed")
    unclassified = launch(python(SLEEPER), gpus=[0], env=BORROWER_LOAD)
    send(redis_client, "n1", guaranteed_job)
    send(redis_client, "n1", unclassified)
    saturated = wait_for(lambda: next((s for s in samples(redis_client) if unclassified.job_id in s.running_jobs
                                       and guaranteed_job.job_id in s.running_jobs and s.gpus[0].util_sm >= 90),
                                      None), timeout=15)
    wait_for(lambda: _samples_since(redis_client, saturated.seq + 15), timeout=15)  # 3 s more of samples
    assert {_duty_of(s, unclassified.job_id) for s in _samples_since(redis_client, saturated.seq - 1)} <= {1.0, None}


def test_the_control_planes_duty_cycle_caps_a_borrower_the_node_raises_again(redis_url, redis_client, start_agent):
    """SetDutyCycle 0.3 with no neighbour: it runs at 0.3. A guaranteed job that saturates the GPU
    (80% + 60% x 0.3) cuts it below; once that job ends it goes back to 0.3, never above."""
    start_agent(redis_url, node="n1", spec="1xV100-32GB", interval=0.2)
    borrower_job = launch(python(SLEEPER), gpus=[0], env=BORROWER_LOAD, job_class="opportunistic")
    send(redis_client, "n1", borrower_job)
    send(redis_client, "n1", command(protocol.SetDutyCycle, borrower_job.job_id, duty_cycle=0.3))
    capped = wait_for(lambda: next((s for s in samples(redis_client)
                                    if _duty_of(s, borrower_job.job_id) == 0.3), None), timeout=15)
    heavy = launch(python(SLEEPER), gpus=[0], job_class="guaranteed",
                   env={"COLONY_SIM_WORKLOAD": "train:mem=8000,util=80,period=5,ramp=0"})
    send(redis_client, "n1", heavy)
    below = wait_for(lambda: next((s for s in _samples_since(redis_client, capped.seq)
                                   if (_duty_of(s, borrower_job.job_id) or 1) < 0.3), None), timeout=10)
    send(redis_client, "n1", stop(heavy.job_id, grace=1))
    wait_for(lambda: next((s for s in _samples_since(redis_client, below.seq)
                           if heavy.job_id not in s.running_jobs and _duty_of(s, borrower_job.job_id) == 0.3), None),
             timeout=15)
    assert max(_duty_of(s, borrower_job.job_id) or 0 for s in _samples_since(redis_client, capped.seq - 1)) == 0.3
