"""Agent authentication end to end: the stack's real agent signs with its own key and its jobs run;
an agent holding another node's key is turned away by the real worker and ingest reader."""

import sys

import pytest
import redis as redis_lib
from rest_framework.test import APIClient

from agents import protocol, signing
from monitoring.models import GpuRollup, Node
from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def dead_letter_reasons(redis_url) -> list[str]:
    client = redis_lib.Redis.from_url(redis_url)
    try:
        return [fields[b"reason"].decode() for _, fields in client.xrange(protocol.DEAD_LETTER_STREAM)]
    finally:
        client.close()


def test_a_signed_agent_runs_jobs_and_an_agent_with_another_nodes_key_is_rejected(stack, live_redis):
    api = APIClient()
    api.force_authenticate(MembershipFactory(user=UserFactory(), tenant=TenantFactory(slug="vision")).user)
    response = api.post("/api/v1/jobs/", {"name": "signed", "command": [sys.executable, "-c", "print('ok')"],
                                          "gpus": 1}, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    done = wait_for(lambda: (j := api.get(f"/api/v1/jobs/{job_id}/").json())["state"] in ("SUCCEEDED", "FAILED")
                    and j, timeout=40, what="the job to finish")
    assert done["state"] == "SUCCEEDED", done
    assert done["allocations"][0]["node"] == "e2e-node"

    # An intruder that stole e2e-node's key but posts as "intruder" (or any other name) gets nowhere.
    stolen = signing.node_key(stack.env["COLONY_AGENT_SECRET"], "e2e-node").hex()
    intruder_env = {k: v for k, v in stack.env.items() if k != "COLONY_AGENT_SECRET"}
    intruder_env["COLONY_AGENT_KEY"] = stolen
    stack.start("agent-intruder", [sys.executable, "-m", "agents", "--node", "intruder", "--simulate", "1xT4-16GB",
                                   "--redis", live_redis, "--interval", "0.2", "--heartbeat-ttl", "1.5",
                                   "--workdir", str(stack.log_dir / "agent-intruder"), "--allow-root-jobs"],
                env=intruder_env)
    reasons = wait_for(lambda: (r := dead_letter_reasons(live_redis)).count("bad signature for node intruder") >= 3
                       and r, timeout=30, what="the intruder's registration and samples to be dead-lettered")
    assert set(reasons) == {"bad signature for node intruder"}  # and nothing the real agent sent
    assert not Node.objects.filter(name="intruder").exists()
    assert not GpuRollup.objects.filter(gpu__node__name="intruder").exists()
