"""The dev stack's supervisor restarts a dead child with exponential backoff, capped, and forgets
the backoff once the child has stayed up; it says so on its output."""

import io
import sys
import time

from cluster_ui.devstack.supervisor import Supervisor, devstack_settings, server_environment


def _run_until(supervisor: Supervisor, predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, supervisor.out.getvalue()
        supervisor.poll()
        time.sleep(0.02)


def test_backoff_doubles_to_its_cap_and_resets_after_the_child_stayed_up(tmp_path):
    out = io.StringIO()
    supervisor = Supervisor(tmp_path, {}, out=out, first_delay=0.1, max_delay=0.4, reset_after=1.0)
    lives = tmp_path / "lives"
    lives.write_text("")
    # Dies at once four times, then stays up 1.5 s and dies, then dies at once again.
    code = ("import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()); "
            "p.write_text('x' * (n + 1)); time.sleep(1.5 if n == 4 else 0); sys.exit(3)")
    child = supervisor.start("flaky", [sys.executable, "-c", code, str(lives)], env=None)
    try:
        _run_until(supervisor, lambda: child.restarts == 6)
        delays = [line.split("restarting in ")[1].split(" s")[0] for line in out.getvalue().splitlines()
                  if "exited with code 3" in line]
        assert delays == ["0.1", "0.2", "0.4", "0.4", "0.1", "0.2"], out.getvalue()
        assert "flaky exited with code 3; restarting in 0.1 s (restart 1)" in out.getvalue()
        assert "flaky restarted (pid " in out.getvalue()
    finally:
        supervisor.stop_all(grace=1)


def test_stop_all_stops_a_child_waiting_for_its_restart_and_the_running_ones(tmp_path):
    supervisor = Supervisor(tmp_path, {}, out=io.StringIO(), first_delay=5)
    dead = supervisor.start("dead", [sys.executable, "-c", "pass"])
    alive = supervisor.start("alive", [sys.executable, "-c", "import time; time.sleep(60)"])
    _run_until(supervisor, lambda: dead.restart_at is not None)
    supervisor.stop_all(grace=5)
    assert alive.process.returncode is not None and dead.process.returncode == 0


def test_children_get_secret_paths_never_secret_values(tmp_path):
    env = server_environment(
        {"PATH": "/bin", "COLONY_AGENT_SECRET": "s" * 32, "REDIS_URL": "redis://:pw@h/0",
         "DATABASE_URL_FILE": "/elsewhere", "DJANGO_SECRET_KEY": "k" * 40, "COLONY_AGENT_KEY": "ab" * 32},
        {"COLONY_AGENT_SECRET": tmp_path / "agent-secret", "REDIS_URL": tmp_path / "redis-url"})
    assert env == {"PATH": "/bin", "COLONY_AGENT_SECRET_FILE": str(tmp_path / "agent-secret"),
                   "REDIS_URL_FILE": str(tmp_path / "redis-url")}


def test_notification_links_point_at_the_port_the_devstack_serves_unless_told_otherwise():
    assert devstack_settings({"PATH": "/bin"}, "/venv/bin/python", 8001)["COLONY_PUBLIC_URL"] == "http://127.0.0.1:8001"
    told = {"PATH": "/bin", "COLONY_PUBLIC_URL": "https://colony.example.org"}
    assert devstack_settings(told, "/venv/bin/python", 8001)["COLONY_PUBLIC_URL"] == "https://colony.example.org"
