"""Fixtures for the node agent tests: a job runner in a temp dir, an agent in a thread.

Nothing here needs Django; the shared ``redis_url``/``redis_client`` fixtures come from
``tests/conftest.py``. Plain helpers live in ``helpers.py``.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest

from agents.accounts import RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.runner import JobRunner


@pytest.fixture
def runner(tmp_path):
    # CI runs as root; these tests are about process handling, not accounts (see test_runner_sandbox).
    runner = JobRunner(tmp_path / "agent", duty_period=0.5, run_as=RunAsPolicy(allow_root=True))
    yield runner
    runner.stop_all(0)  # never leak processes from a failing test
    runner.close()


class RunningAgent:
    """An :class:`Agent` serving in a background thread until :meth:`stop`."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.node = agent.node
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, name=f"agent-{agent.node}", daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            self.agent.run(self.stop_event)
        except BaseException as exc:  # surfaced by stop() so the test fails loudly
            self.errors.append(exc)

    def stop(self, timeout: float = 10.0):
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "agent did not stop"
        assert not self.errors, f"agent loop raised {self.errors[0]!r}"


@pytest.fixture
def start_agent(tmp_path):
    """``start_agent(redis_url, node="n1", spec="2xT4-16GB", interval=0.1)`` -> RunningAgent.

    ``backend=`` replaces the simulated backend built from ``spec``; ``duty_period=`` goes to the runner.
    """
    started: list[RunningAgent] = []

    def start(redis_url: str, node: str = "n1", spec: str = "2xT4-16GB", interval: float = 0.1, *,
              backend=None, duty_period: float = 0.5, **kwargs):
        kwargs.setdefault("heartbeat_ttl", 5.0)
        kwargs.setdefault("shutdown_grace", 1.0)
        agent = Agent(
            node,
            backend or SimulatedBackend(spec, node),
            redis_url,
            JobRunner(tmp_path / f"agent-{node}", duty_period=duty_period, run_as=RunAsPolicy(allow_root=True)),
            interval=interval,
            **kwargs,
        )
        running = RunningAgent(agent)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


@pytest.fixture
def passable_tmp_path(tmp_path):
    """``tmp_path`` with every folder above it, up to the temp root, passable by other accounts.
    A job enters its working directory as its own account (never as root for it), as under
    /var/lib/colony-agent; pytest's folders are 0700 root, which no job account may pass."""
    for folder in (tmp_path, *tmp_path.parents):
        if folder == Path(tempfile.gettempdir()):
            break
        folder.chmod(folder.stat().st_mode | 0o111)
    return tmp_path
