"""A launch that failed on this node (a node-local reason: a code archive it could not fetch, a
missing GPU index) is over here: the control plane retries it elsewhere. A re-send of that launch
(its failure report lost, or late) is answered with the same failure; it never starts here once
the job may already run on another node. Drives the real :class:`agents.command_intake.CommandIntake`
on fakeredis, with a runner that fails the first launch and would start the second.
"""

from __future__ import annotations

from pathlib import Path

import fakeredis
import pytest

from agents import command_intake, protocol, streams
from agents.command_intake import CommandIntake
from agents.job_launching import LaunchError
from agents.recent_exits import RecentExits
from tests.agents.test_stopped_attempt_never_starts import NoDuty, RecordingRunner, launch, send


class FailsOnceRunner(RecordingRunner):
    """Fails the first launch (a transient, node-local fault), would start any later one."""

    def launch(self, command, code_archive=None):
        self.launched.append(command.command_id)
        if len(self.launched) == 1:
            raise LaunchError("cannot start 'python': not found on this node")
        return 4242


@pytest.fixture
def node(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(command_intake, "REANSWER_AFTER_S", 0.0)  # answer a re-send at once
    client = fakeredis.FakeRedis()
    streams.ensure_group(client, protocol.command_stream("n1"), protocol.AGENT_COMMAND_GROUP)
    runner, published, recent = FailsOnceRunner(), [], RecentExits(tmp_path, "n1")

    def publish(message):  # as the agent's: every exit it sends is kept among the recent ones
        published.append(message)
        if isinstance(message, protocol.JobExited):
            recent.add(message)

    intake = CommandIntake("n1", runner, publish=publish, exit_report=None, recent_exits=recent,
                           local_duty=NoDuty(), key=None, max_age=300, max_skew=30, launch_lease=10.0, grace=5.0)
    intake.gpu_indices = {0}
    intake.read_pending = False
    return client, intake, runner, published


def test_a_resent_launch_of_an_attempt_that_failed_here_is_answered_not_started(node):
    client, intake, runner, published = node
    send(client, launch(7, 1))
    intake.read(client, 0)
    [failed] = published
    assert isinstance(failed, protocol.JobExited) and failed.exit_code is None and "python" in failed.error

    send(client, launch(7, 1))  # the control plane did not see the failure in time: re-sent
    intake.read(client, 0)

    assert runner.launched == ["launch-7-1"], "the failed attempt was started on a re-send"
    assert not any(isinstance(m, protocol.JobStarted) for m in published)
    again = [m for m in published[1:] if isinstance(m, protocol.JobExited)]
    assert again and again[-1].launch_id == "launch-7-1" and again[-1].error == failed.error


def test_the_next_attempt_of_that_job_still_runs_here(node):
    client, intake, runner, published = node
    send(client, launch(7, 1))
    intake.read(client, 0)
    send(client, launch(7, 2))
    intake.read(client, 0)

    assert runner.launched == ["launch-7-1", "launch-7-2"]
    assert isinstance(published[-1], protocol.JobStarted) and published[-1].launch_id == "launch-7-2"
