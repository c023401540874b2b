"""The job page in a real browser: a job placed, requeued and placed again reads as two attempts,
each with its GPUs, as the page's script redraws it from the API (saved as
var/screenshots/job-attempts.png)."""

from __future__ import annotations

import re
import time

import pytest

from agents import protocol
from jobs.services import lifecycle
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.submission import requeue_job, submit_job
from tests.browser.conftest import VIEWPORT
from tests.browser.sign_in import sign_in
from tests.factories import GpuFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def _report(client, message):
    client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    consume_events(client)


def test_a_requeued_job_shows_two_attempts(transactional_db, live_redis, redis_client, live_server, browser,
                                           screenshot, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    node = NodeFactory(name="gpu-7")
    for index in range(2):
        GpuFactory(node=node, index=index)
    redis_client.set(protocol.heartbeat_key("gpu-7"), "{}", ex=60)
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    job = submit_job(owner=alice, tenant=alice.memberships.get().tenant, name="resnet", command=["python", "t.py"],
                     gpus=2)
    for attempt in (1, 2):
        run_scheduling_cycle()
        launch = f"launch-{job.pk}-{attempt}"
        _report(redis_client, protocol.JobStarted(node="gpu-7", job_id=job.pk, pid=100 + attempt,
                                                  started_at=time.time(), launch_id=launch))
        if attempt == 1:
            requeue_job(job, by="ops")
            _report(redis_client, protocol.JobExited(node="gpu-7", job_id=job.pk, exit_code=-15, stopped=True,
                                                     finished_at=time.time(), launch_id=launch))
    assert lifecycle.current_launch_id(job.pk) == f"launch-{job.pk}-2"

    page = browser.new_context(viewport=VIEWPORT).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    # The script redraws the timeline from /api/v1/jobs/<id>/ (the attempt rows get the step classes).
    page.wait_for_selector("#timeline li.step-requeued")
    timeline = page.inner_text("#timeline")
    assert re.search(r"ATTEMPT 1.*Placed.*Started.*Stopping.*Requeued by operator ops.*Back in the queue"
                     r".*ATTEMPT 2.*Placed.*Started", timeline, re.S | re.I), timeline
    rows = [row.inner_text() for row in page.query_selector_all("#allocations tbody tr")]
    assert [row.split()[0] for row in rows] == ["2", "2", "1", "1"]  # the current attempt's GPUs first
    assert all("—" in row for row in rows[2:])  # released GPUs: no duty cycle
    screenshot(page, "job-attempts")
    assert errors == []
