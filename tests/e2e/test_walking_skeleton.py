"""A job submitted over the REST API runs on a (simulated) GPU node through real Redis, a real
Celery worker and beat, and a real agent process, and its outcome comes back."""

import os
import sys

import pytest
from rest_framework.test import APIClient

from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


@pytest.fixture
def alice(transactional_db):
    return MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def submit(api, argv, gpus=1, **spec):
    response = api.post("/api/v1/jobs/", {"name": "e2e", "command": argv, "gpus": gpus, **spec}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def job_in(api, job_id, *states, timeout=30):
    return wait_for(lambda: (j := api.get(f"/api/v1/jobs/{job_id}/").json())["state"] in states and j,
                    timeout=timeout, what=f"job {job_id} to reach {states}")


def test_jobs_run_on_the_node_and_report_exit_code_and_output(stack, api):
    ok = submit(api, [sys.executable, "-c",
                      "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"], gpus=2)
    failing = submit(api, [sys.executable, "-c", "import sys; print('bad input'); sys.exit(3)"])

    done = job_in(api, ok, "SUCCEEDED", "FAILED")
    assert done["state"] == "SUCCEEDED", done
    assert done["exit_code"] == 0
    assert {a["node"] for a in done["allocations"]} == {"e2e-node"}
    indices = ",".join(str(a["gpu_index"]) for a in sorted(done["allocations"], key=lambda a: a["gpu_index"]))
    assert f"visible {indices}" in done["output_tail"]
    assert done["started_at"] and done["finished_at"]

    failed = job_in(api, failing, "SUCCEEDED", "FAILED")
    assert (failed["state"], failed["exit_code"]) == ("FAILED", 3)
    assert "bad input" in failed["output_tail"]
    # Both jobs gave their GPUs back.
    assert all(a["released_at"] for a in done["allocations"] + failed["allocations"])


def test_cancel_stops_the_running_process(stack, api, tmp_path):
    pid_file = tmp_path / "job.pid"
    job = submit(api, [sys.executable, "-c",
                       f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"])
    job_in(api, job, "RUNNING")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid file"))

    response = api.post(f"/api/v1/jobs/{job}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] in ("CANCELLING", "CANCELLED")

    cancelled = job_in(api, job, "CANCELLED", "FAILED", "SUCCEEDED")
    assert cancelled["state"] == "CANCELLED"

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=10, what=f"process {pid} to be gone")


def test_a_job_past_its_runtime_limit_ends_timeout_within_the_grace(stack, api):
    """`max_runtime_s: 5` on a 60 s sleep: the node stops it (SIGTERM, SIGKILL after the stack's
    3 s grace) and it ends TIMEOUT, its GPU given back."""
    job = submit(api, [sys.executable, "-c", "import time; print('working', flush=True); time.sleep(60)"],
                 max_runtime_s=5)
    running = job_in(api, job, "RUNNING")
    # Its output streams while it runs (live logs), long before it ends.
    live = wait_for(lambda: (body := api.get(f"/api/v1/jobs/{job}/logs/").json())["chunks"] and body, timeout=4,
                    what="live output")
    assert "working" in "".join(chunk["data"] for chunk in live["chunks"]) and not live["finished"]
    ended = job_in(api, job, "TIMEOUT", "SUCCEEDED", "FAILED", timeout=30)
    assert ended["state"] == "TIMEOUT", ended
    assert "runtime limit of 5 s" in ended["error"] and "working" in ended["output_tail"]
    from datetime import datetime

    ran_s = (datetime.fromisoformat(ended["finished_at"])
             - datetime.fromisoformat(running["started_at"])).total_seconds()
    # The node counts the limit from the process's start, a moment before it reports the start.
    assert 4.5 <= ran_s <= 5 + 3 + 2, ran_s  # the limit, the grace, and a little slack
    assert all(a["released_at"] for a in ended["allocations"])
