"""The job page of a notebook job follows it live: a page opened while the job waits shows "Open
notebook" once it starts running, without a reload, and hides it again once the job ends."""

from __future__ import annotations

import time

import pytest

from agents import protocol, tunnel_protocol
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from jobs.services.submission import submit_job
from tests.browser.conftest import VIEWPORT
from tests.browser.sign_in import sign_in
from tests.factories import GpuFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def _report(client, message):
    client.xadd(protocol.EVENTS_STREAM, protocol.encode(message))
    consume_events(client)


def test_open_notebook_appears_when_the_job_starts_and_goes_when_it_ends(transactional_db, live_redis, redis_client,
                                                                        live_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    node = NodeFactory(name="gpu-3")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("gpu-3"), "{}", ex=60)
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision")).user
    job = submit_job(owner=alice, tenant=alice.memberships.get().tenant, name="lab", command=["jupyter", "lab"],
                     gpus=1, env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "1200"})

    page = browser.new_context(viewport=VIEWPORT).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#job-updated:not(:empty)")  # the script has drawn the page from the API once
    assert not page.is_visible("#notebook-open a")
    assert "it opens here while it runs" in page.inner_text("#notebook-open")

    run_scheduling_cycle()
    launch = f"launch-{job.pk}-1"
    _report(redis_client, protocol.JobStarted(node="gpu-3", job_id=job.pk, pid=101, started_at=time.time(),
                                              launch_id=launch))
    page.wait_for_selector("#notebook-open a", state="visible", timeout=15_000)  # no reload
    assert page.get_attribute("#notebook-open a", "href") == f"/jobs/{job.pk}/notebook/"
    assert "opens here while it runs" not in page.inner_text("#notebook-open")

    _report(redis_client, protocol.JobExited(node="gpu-3", job_id=job.pk, exit_code=0, stopped=False,
                                             finished_at=time.time(), launch_id=launch))
    page.wait_for_selector("#notebook-open a", state="hidden", timeout=15_000)
    assert "it has ended" in page.inner_text("#notebook-open")
    assert errors == []
