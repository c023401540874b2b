"""``colony jupyter`` as a researcher uses it: the CLI submits a notebook job (placed and run by the
real worker and agent), waits until it runs and says where to open it; the job page's "Open
notebook" takes the signed-in browser through the notebook proxy and the node's tunnel to
JupyterLab inside the job, where a new notebook runs a cell (a kernel round trip over the proxied
WebSocket). The server itself, on the node's loopback, refuses anyone without its token; a job
whose environment has no jupyter fails, and the CLI says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from rest_framework.authtoken.models import Token

from jobs.models import Job
from jobs.services import notebook_tokens
from jobs.services.commands import launch_id
from tests.browser.conftest import VIEWPORT
from tests.e2e.conftest import ROOT, wait_for
from tests.browser.sign_in import sign_in
from tests.factories import MembershipFactory, TenantFactory, UserFactory

VENV = str(Path(sys.executable).parent.parent)  # the test run's own virtualenv has jupyterlab (the test extra)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def colony(live_server, user, tmp_path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLONY_URL": live_server.url, "COLONY_TOKEN": Token.objects.get_or_create(user=user)[0].key,
           "COLONY_CONFIG": str(tmp_path / "absent.toml")}
    return subprocess.run([sys.executable, "-m", "cluster_ui.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_a_researcher_opens_a_notebook_on_a_gpu_and_runs_a_cell(backend, browser, live_server, settings, tmp_path,
                                                                screenshot):
    port = free_port()
    backend.start("notebooks", [sys.executable, "manage.py", "notebook_proxy", "--port", str(port)],
                  env={**backend.env, "COLONY_HTTPS": "0"})
    settings.COLONY_NOTEBOOK_URL = f"http://127.0.0.1:{port}"
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user

    # The CLI: submitted, placed, running; it says where to open it.
    done = colony(live_server, alice, tmp_path, "jupyter", "--gpus", "1", "--venv", VENV, "--idle", "20m")
    assert done.returncode == 0, done.stdout + done.stderr
    job = Job.objects.get()
    assert "Submitted notebook" in done.stderr and f"{live_server.url}/jobs/{job.pk}/notebook/" in done.stdout
    assert job.command == ["jupyter", "lab"] and job.state == "RUNNING"

    # On the node: JupyterLab listens on loopback and answers only to its token.
    port_file = wait_for(lambda: next(Path(tmp_path / "agent").rglob("notebook.port"), None), timeout=60,
                         what="notebook port")
    local = f"http://127.0.0.1:{port_file.read_text().strip()}/notebooks/{job.pk}/api/status"
    token = notebook_tokens.token(launch_id(job.pk, job.attempt))
    try:
        # JupyterLab starts in 3-5 s alone; on a machine busy with other tests, several times that.
        wait_for(lambda: _status(local, f"token {token}") == 200, timeout=180, interval=0.5, what="JupyterLab to serve")
    except AssertionError:
        print((port_file.parent / "output.log").read_text()[-5000:])
        raise
    assert _status(local, None) == 403 and _status(local, "token guessed") == 403

    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(120_000)
    page = context.new_page()
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    with context.expect_page() as opened:
        page.click("#notebook-open a")
    lab = opened.value
    lab.wait_for_url(re.compile(rf"127\.0\.0\.1:{port}/notebooks/{job.pk}/lab"))
    assert "colony_ticket" not in lab.url  # traded for a cookie at once
    lab.locator(".jp-LauncherCard[data-category='Notebook']").first.click()
    # Its kernel started and connected over the proxied WebSocket (the status bar says so).
    lab.get_by_text(re.compile(r"ipykernel\) \| Idle")).first.wait_for()
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    cell.type("print(6 * 7, 'from', 'the', 'job')")
    lab.keyboard.press("Shift+Enter")
    try:
        lab.locator(".jp-OutputArea-output", has_text="42 from the job").wait_for()
    except Exception:
        screenshot(lab, "notebook-in-a-job-failed")
        print(lab.locator(".jp-Notebook").inner_text())
        raise
    screenshot(lab, "notebook-in-a-job")
    context.close()


def test_a_notebook_job_without_jupyter_fails_and_the_cli_says_why(backend, live_server, tmp_path):
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    done = colony(live_server, alice, tmp_path, "jupyter", "--gpus", "1")  # no --venv: the node's PATH has none
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ended: FAILED (exit code 127)" in done.stdout
    assert "`jupyter` is not installed in this job's environment" in done.stdout


def _status(url: str, authorization: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
