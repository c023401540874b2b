"""PostgreSQL goes away for a few seconds under the real worker, ingest reader and agent: the
scheduling loop backs off and resumes, ingest waits and loses no sample, the agent and its job
never notice, and the job's exit is recorded once the database is back.

The outage: the test database stops taking connections and every server process's session is
terminated (the test's own connection is spared so it can look). PostgreSQL only."""

import sys
import time

import psycopg
import pytest
import redis as redis_lib
from django.db import connection
from rest_framework.test import APIClient

from agents import protocol
from monitoring.models import GpuRollup
from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

OUTAGE_S = 5.0


def admin_connection():
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                           password=db["PASSWORD"] or None, dbname="postgres", autocommit=True)


def rollup_samples() -> int:
    return sum(GpuRollup.objects.filter(gpu__node__name="e2e-node").values_list("samples", flat=True))


def test_a_database_outage_pauses_the_control_plane_and_loses_nothing(stack, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the outage is made with PostgreSQL's ALLOW_CONNECTIONS")
    api = APIClient()
    api.force_authenticate(MembershipFactory(user=UserFactory(), tenant=TenantFactory(slug="vision")).user)
    marker = tmp_path / "ran.txt"
    script = f"import time; open({str(marker)!r}, 'a').write('run\\n'); time.sleep({OUTAGE_S + 2}); print('done')"
    job = api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", script], "gpus": 1}, format="json").json()["id"]
    wait_for(lambda: api.get(f"/api/v1/jobs/{job}/").json()["state"] == "RUNNING", timeout=30, what="RUNNING")
    wait_for(lambda: rollup_samples() > 0, what="samples in the rollups")
    samples_before = rollup_samples()

    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        ours = cursor.fetchone()[0]
    with admin_connection() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                          (name, ours))
            # Submitted while the server processes cannot reach the database (our connection can).
            late = api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", "print('late')"], "gpus": 1},
                            format="json").json()["id"]
            time.sleep(OUTAGE_S)
            assert marker.read_text() == "run\n"  # the agent and its job carried on
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    done = wait_for(lambda: (j := api.get(f"/api/v1/jobs/{job}/").json())["state"] in ("SUCCEEDED", "FAILED") and j,
                    timeout=60, what="the exit recorded after the outage")
    assert done["state"] == "SUCCEEDED" and "done" in done["output_tail"]
    late_done = wait_for(lambda: (j := api.get(f"/api/v1/jobs/{late}/").json())["state"] in ("SUCCEEDED", "FAILED")
                         and j, timeout=60, what="the job submitted during the outage to run")
    assert late_done["state"] == "SUCCEEDED"
    assert marker.read_text() == "run\n"  # once
    for name_, process in stack.started:
        assert process.poll() is None, f"{name_} died during the outage"
    # Ingest waited with its batch unacked, then caught up: nothing is left pending or unread.
    def caught_up():
        group = next(g for g in stream_client.xinfo_groups(protocol.METRICS_STREAM) if g["name"] == b"ingest")
        return group["pending"] == 0 and group["lag"] == 0 and rollup_samples() > samples_before
    stream_client = redis_lib.Redis.from_url(stack.env["REDIS_URL"])
    wait_for(caught_up, timeout=30, what="ingest to catch up")
    stream_client.close()
    logs = stack.logs()
    assert "database unavailable" in logs

