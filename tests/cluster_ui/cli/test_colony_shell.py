"""``colony shell`` as a user runs it: in a real terminal (a pseudo-terminal here), against the API
with their token, a real worker placing the session and a real agent running it on a terminal of
its own. What is typed reaches the job's shell, what it prints comes back, and ``exit 3`` ends the
job FAILED with exit code 3, which ``colony shell`` exits with."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from rest_framework.authtoken.models import Token

from jobs.models import Job
from tests.e2e.conftest import ROOT, stack, stack_overrides  # noqa: F401  (fixtures)
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


class Terminal:
    """A process on a pseudo-terminal, and everything it printed so far."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                                        start_new_session=True)
        os.close(slave)
        self.screen = b""

    def expect(self, text: bytes, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not seen in {timeout}s; the terminal shows:\n{self.screen!r}")
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:  # the process ended and its terminal closed
                    if self.process.poll() is not None and text not in self.screen:
                        raise AssertionError(f"{text!r} never seen; the terminal shows:\n{self.screen!r}") from None

    def expect_prompt(self, timeout: float = 60.0) -> None:
        """Until the remote shell prints its prompt (``# `` or ``$ ``) after attaching."""
        deadline = time.monotonic() + timeout
        while not any(p in self.screen.partition(b"Attached to session ")[2] for p in (b"# ", b"$ ")):
            self.expect(b"Attached to session ", timeout=max(0.0, deadline - time.monotonic()))
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                self.screen += os.read(self.master, 65536)
            if time.monotonic() > deadline:
                raise AssertionError(f"no prompt in {timeout}s; the terminal shows:\n{self.screen!r}")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.master)


def test_colony_shell_runs_a_terminal_on_the_node_and_exits_with_the_shells_code(stack, live_server, tmp_path):
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    env = {**os.environ, "COLONY_URL": live_server.url, "COLONY_TOKEN": Token.objects.create(user=alice).key,
           "COLONY_CONFIG": str(tmp_path / "absent.toml"), "TERM": "xterm"}
    terminal = Terminal([sys.executable, "-m", "cluster_ui.cli", "shell", "--gpus", "1", "--idle", "10m"], env)
    try:
        terminal.expect(b"Submitted session ")
        terminal.expect(b"Attached to session ")
        job = Job.objects.get()
        assert job.owner == alice and job.command == ["bash", "-l"] and job.state == "RUNNING"
        # Typed before the shell reads its terminal, a line may be lost (as on any slow login).
        terminal.expect_prompt()
        terminal.type(b"echo hello-$((6*7)) $(stty size)\r")
        terminal.expect(b"hello-42 30 100", timeout=30)  # the job's terminal has this one's size
        terminal.type(b"exit 3\r")
        terminal.expect(b"ended: FAILED (exit code 3)", timeout=30)
        assert terminal.process.wait(10) == 3
        job.refresh_from_db()
        assert (job.state, job.exit_code) == ("FAILED", 3)
        assert "hello-42" in job.output_tail  # kept as a batch job's output is
    finally:
        terminal.close()
