"""The control plane and its agents under seeded faults, on the simulated clock: every invariant
of :mod:`tests.simulation.invariants` holds for each seed. A failing seed reproduces with
``PYTHONHASHSEED=0 .venv/bin/python bench/simulate_protocol.py --seed N`` (its whole trace);
the bench runs thousands.
"""

import re

import pytest

from agents import protocol
from tests.simulation import invariants
from tests.simulation.sim_node import SimProcess
from tests.simulation.world import Config, run_seed

SEEDS = 24
CHUNKS = 4


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_invariant_holds_under_faults(db, chunk):
    failed = {}
    for seed in range(chunk, SEEDS, CHUNKS):
        outcome = run_seed(seed)
        if not outcome.ok:
            failed[seed] = outcome.violations[:3] + outcome.trace[-15:]
    assert not failed, "\n".join(
        f"seed {seed} (PYTHONHASHSEED=0 .venv/bin/python bench/simulate_protocol.py --seed {seed}):\n  "
        + "\n  ".join(lines) for seed, lines in failed.items())


def test_a_seed_replays_the_same_run(db):
    first, second = run_seed(7), run_seed(7)
    # (job ids are the database's: PostgreSQL's sequences move on past a rolled-back seed)
    assert _renumbered(first.trace) == _renumbered(second.trace)
    assert first.events == second.events > 100


def _renumbered(trace: list[str]) -> list[str]:
    """The trace with each job id replaced by the order in which the trace first names it."""
    ids: dict[str, int] = {}

    def number(match):
        return f"{match[1]}{ids.setdefault(match[2], len(ids) + 1)}"

    return [re.sub(r"(job |launch-|stop-|resume-|query-|suspend-|duty-)(\d+)", number, line) for line in trace]


def test_without_faults_every_job_succeeds_or_fails_once(db):
    outcome = run_seed(3, Config(faults=False))
    assert outcome.ok, outcome.violations
    assert set(outcome.final_states.values()) <= {"SUCCEEDED", "FAILED"}
    assert len(outcome.final_states) == Config().jobs


def run(job_id, attempt, node, gpu, started_at):
    launch = protocol.LaunchJob(command_id=f"launch-{job_id}-{attempt}", attempt=attempt, job_id=job_id,
                                argv=["train"], gpu_indices=[gpu])
    return SimProcess(node=node, launch=launch, pid=1000 + attempt, started_at=started_at, natural_end=started_at + 10,
                      natural_code=0)


def test_the_checks_catch_a_gpu_held_twice_and_a_job_completed_twice():
    first, second = run(1, 1, "sim0", 0, 0.0), run(1, 2, "sim0", 0, 50.0)
    assert invariants.gpus_held_twice([first, second]) == [
        "GPU 0 of sim0 held by 2 live runs: launch-1-1, launch-1-2"]
    assert invariants.completed_twice({1: [first, second]}, {}, {}, {})
    # Its node lost while it ran, its exit sent after the next launch reached the node: excused.
    exits, launches = {(1, "launch-1-1"): 60.0}, {"launch-1-2": 45.0}
    assert not invariants.completed_twice({1: [first, second]}, {"sim0": [40.0]}, exits, launches)
    # The exit was in Redis before that launch arrived: the control plane could have known.
    assert invariants.completed_twice({1: [first, second]}, {"sim0": [40.0]}, {(1, "launch-1-1"): 41.0}, launches)
