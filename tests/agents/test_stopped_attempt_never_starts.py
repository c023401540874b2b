"""An attempt a stop named never starts on that node, whenever its launch comes.

Found by the deterministic simulation (tests/simulation; issue 35): a launch re-sent for attempt 1
reached its node after the node had been lost and the job requeued, still within the 10 s launch
lease, and after the stop of that attempt had been answered ("not running here"). Read in a later
batch than its stop, nothing withdrew it, and the job ran beside its next attempt: twice. The
agent now remembers the attempts a stop named and refuses their launch. Drives the real
:class:`agents.command_intake.CommandIntake` on fakeredis, with a runner that records launches.
"""

from __future__ import annotations

import time
from pathlib import Path

import fakeredis
import pytest

from agents import protocol, streams
from agents.command_intake import CommandIntake
from agents.recent_exits import RecentExits


class RecordingRunner:
    def __init__(self):
        self.launched: list[str] = []

    def launch_of(self, job_id):
        return None

    def running_launches(self):
        return {}

    def needs_code(self, command):
        return False

    def launch(self, command, code_archive=None):
        self.launched.append(command.command_id)
        return 4242

    def adopt_late(self, job_id, launch_id, grace):
        return []

    def never_started(self, command):
        return False


class NoDuty:
    def started(self, job_id):
        pass


@pytest.fixture
def node(tmp_path: Path):
    client = fakeredis.FakeRedis()
    streams.ensure_group(client, protocol.command_stream("n1"), protocol.AGENT_COMMAND_GROUP)
    runner, published = RecordingRunner(), []
    intake = CommandIntake("n1", runner, publish=published.append, exit_report=None,
                           recent_exits=RecentExits(tmp_path, "n1"), local_duty=NoDuty(), key=None, max_age=300,
                           max_skew=30, launch_lease=10.0, grace=5.0)
    intake.gpu_indices = {0}
    intake.read_pending = False
    return client, intake, runner, published


def send(client, command):
    command = command.model_copy(update={"node": "n1", "issued_at": time.time()})
    client.xadd(protocol.command_stream("n1"), protocol.encode(command))


def launch(job_id, attempt):
    return protocol.LaunchJob(command_id=f"launch-{job_id}-{attempt}", attempt=attempt, job_id=job_id,
                              argv=["train"], gpu_indices=[0])


def stop(job_id, attempt):
    return protocol.StopJob(command_id=f"stop-{job_id}-{attempt}", job_id=job_id,
                            launch_id=f"launch-{job_id}-{attempt}")


def test_a_launch_arriving_after_its_attempts_stop_never_starts(node):
    client, intake, runner, published = node
    send(client, stop(7, 1))  # the node was lost, the job requeued: attempt 1 is stopped
    intake.read(client, block_ms=1)
    send(client, launch(7, 1))  # a re-send of that attempt's launch, fresh, in a later batch
    intake.read(client, block_ms=1)
    assert runner.launched == []
    refused = [m for m in published if isinstance(m, protocol.CommandRejected)]
    assert refused and "was stopped here before its launch came" in refused[0].reason


def test_the_next_attempt_of_a_stopped_one_still_starts(node):
    client, intake, runner, _ = node
    send(client, stop(7, 1))
    intake.read(client, block_ms=1)
    send(client, launch(7, 2))
    intake.read(client, block_ms=1)
    assert runner.launched == ["launch-7-2"]


def test_a_stop_naming_no_attempt_keeps_no_launch_from_starting(node):
    client, intake, runner, _ = node
    send(client, protocol.StopJob(command_id="stop-7", job_id=7))  # a stray's stop: whatever runs
    intake.read(client, block_ms=1)
    send(client, launch(7, 1))
    intake.read(client, block_ms=1)
    assert runner.launched == ["launch-7-1"]
