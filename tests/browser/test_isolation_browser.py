"""The node page in a real browser says how each GPU fences the jobs that share it (MPS, the
driver's memory limit, a MIG instance of which GPU, or unfenced), and keeps saying it after its
script redraws the live readings from the API (saved as var/screenshots/node-isolation.png)."""

from __future__ import annotations

import time

import pytest

from agents import protocol
from monitoring.services import live
from monitoring.services.registry import register_node
from tests.browser.conftest import VIEWPORT
from tests.browser.sign_in import sign_in
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def test_the_node_page_shows_each_gpus_isolation_mode(transactional_db, live_redis, redis_client, live_server,
                                                      browser, screenshot, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    register_node(protocol.NodeRegistered(node="h100-1", hostname="h100-1", backend="nvml", agent_version="t", gpus=[
        protocol.GpuInfo(index=0, uuid="GPU-0", model="H100-80GB", memory_mib=81559, isolation="mps"),
        protocol.GpuInfo(index=1, uuid="GPU-1", model="H100-80GB", memory_mib=81559, isolation="memory_limit"),
        protocol.GpuInfo(index=2, uuid="GPU-2", model="H100-80GB", memory_mib=81559),  # says nothing: unfenced
        protocol.GpuInfo(index=3, uuid="MIG-3", model="H100-80GB", memory_mib=9984, isolation="mig",
                         mig_profile="1g.10gb", parent_index=3),
    ]))
    MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision"))

    page = browser.new_context(viewport=VIEWPORT).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/nodes/h100-1/")
    assert "no samples" in page.inner_text("#node-gpus tr[data-index='3'] .util")
    live.store_latest(redis_client, [protocol.NodeSample(
        node="h100-1", ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=i, util_sm=40.0 + i, mem_used_mib=1000, mem_total_mib=81559)
              for i in range(4)])])
    # The script's poll of /api/v1/nodes/h100-1/ has redrawn the readings, and left the modes be.
    page.wait_for_function("document.querySelector('#node-gpus tr[data-index=\"3\"] .util')"
                           ".textContent.includes('43%')")
    cells = [cell.inner_text().strip() for cell in page.query_selector_all("#node-gpus tbody td.isolation")]
    assert cells == [
        "MPS (memory and compute limits per job)",
        "Driver memory limit per job",
        "Unfenced (no limits: shared only by jobs that accept it)",
        "MIG 1g.10gb of GPU 3: one job, fenced in hardware",
    ]
    screenshot(page, "node-isolation")

    # The submit form offers the cluster's MIG profiles and spells the choice as a command line.
    page.goto(f"{live_server.url}/jobs/submit/")
    page.select_option("select[name=mig_profile]", "1g.10gb")
    page.select_option("select[name=accepts_unfenced]", "no")
    assert "--mig-profile 1g.10gb --no-unfenced" in page.inner_text("#cli-equivalent")
    assert errors == []
