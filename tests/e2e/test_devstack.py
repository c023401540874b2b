"""The README's first command: ``python -m cluster_ui.devstack`` brings everything up on
embedded defaults, serves the login page, and Ctrl-C leaves no process behind."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from cluster_ui.devstack.redis_server import free_port
from tests.e2e.conftest import ROOT, wait_for

pytestmark = pytest.mark.e2e


def test_devstack_comes_up_seeded_and_ctrl_c_leaves_no_orphans(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env["COLONY_VAR_DIR"] = str(tmp_path)
    log = open(tmp_path / "devstack.out", "w+b")
    stack = subprocess.Popen([sys.executable, "-m", "cluster_ui.devstack", "--port", str(port),
                              "--node", "2xT4-16GB", "--node", "2xT4-16GB"],
                             cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    output = lambda: (tmp_path / "devstack.out").read_text()  # noqa: E731
    try:
        wait_for(lambda: "Colony is up." in output() or stack.poll() is not None, timeout=90, what="the banner")
        assert stack.poll() is None, output()
        assert "alice / colony-demo" in output()

        def login_page():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(login_page, timeout=30, what="the web server")
        descendants = psutil.Process(stack.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in descendants)
        assert "celery" in names and "beat" in names and names.count("-m agents") == 2 and "runserver" in names

        stack.send_signal(signal.SIGINT)
        assert stack.wait(45) == 0, output()
        deadline = time.monotonic() + 10
        alive = descendants
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.2)
        assert not alive, [p.cmdline() for p in alive]
        assert "Stopped." in output()
    finally:
        if stack.poll() is None:
            stack.kill()
        log.close()
