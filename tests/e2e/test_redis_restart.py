"""Redis restarts empty (it keeps nothing on disk) while a job runs: the agent reconnects and
re-registers, the job's exit still arrives, nothing runs twice, and new work flows again."""

import sys

import pytest
from rest_framework.test import APIClient

from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def test_job_survives_a_redis_restart_and_runs_once(stack, redis_server, tmp_path):
    user = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    api = APIClient()
    api.force_authenticate(user)
    runs = tmp_path / "runs.txt"
    script = f"import time; open({str(runs)!r}, 'a').write('run\\n'); time.sleep(6); print('done')"
    job = api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", script], "gpus": 1}, format="json").json()["id"]

    def state(job_id):
        return api.get(f"/api/v1/jobs/{job_id}/").json()

    wait_for(lambda: state(job)["state"] == "RUNNING", timeout=30, what="RUNNING")
    redis_server.restart()

    finished = wait_for(lambda: (j := state(job))["state"] in ("SUCCEEDED", "FAILED") and j, timeout=60,
                        what="the exit reported after the restart")
    assert finished["state"] == "SUCCEEDED" and "done" in finished["output_tail"]
    assert runs.read_text() == "run\n"  # ran exactly once

    after = api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", "print('again')"], "gpus": 1},
                     format="json").json()["id"]
    again = wait_for(lambda: (j := state(after))["state"] in ("SUCCEEDED", "FAILED") and j, timeout=60,
                     what="a job submitted after the restart")
    assert again["state"] == "SUCCEEDED"
