"""Reports lost on the way are recovered by reconciliation, not by running jobs again.

While jobs start and finish, something holding the node's Redis user (a bug, or a job that stole
it) trims the node's own events stream to nothing over and over, so their start and exit reports
are lost unread. Once it stops, the control plane reconciles against the node's samples and asks
the node about each attempt: every job ends SUCCEEDED with its output, and each ran once.
"""

import sys
import threading
import time

import pytest
import redis as redis_lib
from rest_framework.test import APIClient

from agents import protocol
from tests.e2e.conftest import wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

NODE = "e2e-node"


class Trimmer(threading.Thread):
    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.trimmed = url, threading.Event(), 0

    def run(self):
        client = redis_lib.Redis.from_url(self.url)
        while not self.stop.is_set():
            self.trimmed += client.xtrim(protocol.node_events_stream(NODE), maxlen=0)
            time.sleep(0.002)


def test_start_and_exit_reports_trimmed_away_are_recovered_and_nothing_runs_twice(stack, live_redis, tmp_path):
    user = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    api = APIClient()
    api.force_authenticate(user)
    runs = tmp_path / "runs.txt"
    runs.touch()
    runs.chmod(0o666)
    trimmer = Trimmer(live_redis)
    trimmer.start()
    script = f"import os; open({str(runs)!r}, 'a').write(os.environ['COLONY_JOB_ID'] + '\\n'); print('ran')"
    jobs = [api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", script], "gpus": 1}, format="json")
            .json()["id"] for _ in range(2)]  # one per GPU of the node: all run while reports are lost
    try:
        wait_for(lambda: len(runs.read_text().splitlines()) >= len(jobs), timeout=60, what="every job to run")
        time.sleep(1.0)
    finally:
        trimmer.stop.set()
        trimmer.join(5)
    assert trimmer.trimmed > 0

    def state(job_id):
        return api.get(f"/api/v1/jobs/{job_id}/").json()

    finished = [wait_for(lambda j=j: (s := state(j))["state"] in ("SUCCEEDED", "FAILED", "PENDING") and s,
                         timeout=60, what=f"job {j} to settle") for j in jobs]
    print(f"\nlost reports: {trimmer.trimmed} events trimmed; states {[f['state'] for f in finished]}")
    assert [f["state"] for f in finished] == ["SUCCEEDED"] * len(jobs)
    assert all("ran" in f["output_tail"] for f in finished)
    assert sorted(runs.read_text().split()) == sorted(str(j) for j in jobs)  # each ran once
