"""Issue 3 end to end: a simulated agent's samples reach rollups and the job's peak memory; a node
killed with SIGKILL becomes LOST and its job is requeued exactly once, then runs when it is back."""

import os
import signal
import sys

import pytest
from rest_framework.test import APIClient

from monitoring.choices import NodeState
from monitoring.models import GpuRollup, JobRollup, Node
from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(transactional_db):
    user = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    client = APIClient()
    client.force_authenticate(user)
    return client


def submit(api, argv, **spec):
    response = api.post("/api/v1/jobs/", {"command": argv, "gpus": 1, **spec}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def job(api, job_id):
    return api.get(f"/api/v1/jobs/{job_id}/").json()


def test_samples_reach_rollups_and_the_jobs_peak_memory(stack, api):
    job_id = submit(api, [sys.executable, "-c", "import time; time.sleep(3)"],
                    env={"COLONY_SIM_WORKLOAD": "idle:mem=12000"})
    done = wait_for(lambda: (j := job(api, job_id))["state"] in ("SUCCEEDED", "FAILED") and j, timeout=40,
                    what="the job to finish")
    assert done["state"] == "SUCCEEDED", done
    assert done["peak_gpu_memory_mib"] == pytest.approx(12000, rel=0.02)
    wait_for(lambda: JobRollup.objects.filter(job_id=job_id).exists(), what="job rollups")
    assert JobRollup.objects.filter(job_id=job_id).order_by("-mem_max").first().mem_max == pytest.approx(12000, rel=0.02)
    rollups = GpuRollup.objects.filter(gpu__node__name="e2e-node")
    assert rollups.filter(gpu__index=done["allocations"][0]["gpu_index"], mem_max__gte=11_000).exists()
    assert rollups.values("gpu").distinct().count() == 2  # the idle GPU is sampled too


def test_killed_node_is_lost_its_job_requeued_once_and_run_when_it_returns(stack, api):
    doomed = stack.start_agent("doomed", "1xT4-16GB")
    wait_for(lambda: Node.objects.filter(name="doomed").exists(), what="doomed node registration")
    job_id = submit(api, [sys.executable, "-c", "import time; time.sleep(600)"], gpu_models=["T4-16GB"])
    wait_for(lambda: job(api, job_id)["state"] == "RUNNING", timeout=30, what="the job to run on doomed")
    job_pgid = None
    import psutil

    for child in psutil.Process(doomed.pid).children(recursive=True):
        job_pgid = os.getpgid(child.pid)
    # The node dies: its agent and the job's processes, all at once.
    os.killpg(doomed.pid, signal.SIGKILL)
    if job_pgid:
        os.killpg(job_pgid, signal.SIGKILL)
    doomed.wait()

    wait_for(lambda: Node.objects.get(name="doomed").state == NodeState.LOST, timeout=30, what="LOST")
    requeued = wait_for(lambda: (j := job(api, job_id))["state"] == "PENDING" and j, what="requeue")
    assert requeued["requeue_count"] == 1
    assert all(a["released_at"] for a in requeued["allocations"])

    stack.start_agent("doomed", "1xT4-16GB")
    back = wait_for(lambda: (j := job(api, job_id))["state"] == "RUNNING" and j, timeout=40,
                    what="the job to run again when the node is back")
    assert Node.objects.get(name="doomed").state == NodeState.UP
    assert back["requeue_count"] == 1
    assert api.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
    wait_for(lambda: job(api, job_id)["state"] == "CANCELLED", timeout=30, what="cancel")


def test_an_agent_killed_under_its_job_stops_the_orphan_on_restart_and_the_job_runs_again_once(stack, api, tmp_path):
    import psutil

    attempts = tmp_path / "attempts.txt"
    script = (f"import os, time; p = {str(attempts)!r}; n = len(open(p).readlines()) if os.path.exists(p) else 0; "
              "open(p, 'a').write(f'{os.getpid()}\\n'); print('attempt', n + 1, flush=True); "
              "time.sleep(120 if n == 0 else 0)")
    job_id = submit(api, [sys.executable, "-c", script])
    wait_for(lambda: job(api, job_id)["state"] == "RUNNING" and attempts.exists(), timeout=30, what="the first run")
    first_pid = int(attempts.read_text().split()[0])
    agent = next(p for name, p in stack.started if name == "agent-e2e-node")
    agent.kill()  # SIGKILL to the agent alone: its job runs on, orphaned
    agent.wait()
    assert psutil.pid_exists(first_pid)

    stack.start_agent("e2e-node", "2xA100-80GB")
    wait_for(lambda: len(attempts.read_text().split()) == 2, timeout=60, what="the second attempt")
    # The orphan was stopped before the job could start again: never two runs at once.
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE
    done = wait_for(lambda: (j := job(api, job_id))["state"] in ("SUCCEEDED", "FAILED") and j, timeout=30,
                    what="the second attempt to finish")
    assert done["state"] == "SUCCEEDED" and "attempt 2" in done["output_tail"]
    assert done["requeue_count"] == 1
    assert len(attempts.read_text().split()) == 2
