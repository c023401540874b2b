"""A researcher in a real browser: log in, submit through the form, follow the job in the queue
from RUNNING to SUCCEEDED, read its page, find it on the heatmap (hover names it, click opens it),
and look at every main page. Saves 1440x900 screenshots under var/screenshots/.

Everything runs for real: the job is placed by the scheduler in the Celery worker, run by the
simulated agent, and its samples reach the heatmap through the ingest reader (no rows are faked).
"""

from __future__ import annotations

import re
import sys

import pytest
from rest_framework.test import APIClient

from monitoring.models import GpuRollup, JobRollup
from tests.browser.conftest import VIEWPORT
from tests.e2e.conftest import wait_for
from tests.browser.sign_in import sign_in
from tests.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

CELLS_WITH_DATA = "() => { const g = document.getElementById('heatmap'); " \
                  "return !!(g && g.data && g.data[0].z.some(r => r.some(v => v !== null))); }"


def submit_over_api(user, **job):
    client = APIClient()
    client.force_authenticate(user)
    response = client.post("/api/v1/jobs/", job, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def cell_of(page, job_name: str):
    """Pixel position of a heatmap cell whose hover names ``job_name``."""
    return page.evaluate("""name => {
        const g = document.getElementById('heatmap'), trace = g.data[0], layout = g._fullLayout;
        const box = g.querySelector('.nsewdrag').getBoundingClientRect();
        for (let r = trace.text.length - 1; r >= 0; r--) {
            for (let c = trace.text[r].length - 1; c >= 0; c--) {
                if (trace.text[r][c].includes(name) && trace.z[r][c] !== null) {
                    return {x: box.left + layout.xaxis.d2p(trace.x[c]) + 2,
                            y: box.top + layout.yaxis.d2p(trace.y[r])};
                }
            }
        }
        return null;
    }""", job_name)


def test_researcher_follows_a_job_from_the_form_to_the_heatmap(backend, browser, live_server, screenshot):
    from django.contrib.auth import get_user_model

    vision = TenantFactory(slug="vision", name="Vision Lab", guaranteed_gpus=1, max_gpus=2)
    nlp = TenantFactory(slug="nlp", name="NLP Group", guaranteed_gpus=1, max_gpus=2)
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    bob = MembershipFactory(user=UserFactory(username="bob"), tenant=nlp).user
    UserFactory(username="operator", is_staff=True, is_superuser=True)
    url = live_server.url

    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # Log in.
    sign_in(page, url)

    # The form refuses what the API refuses, in the API's words.
    page.goto(f"{url}/jobs/submit/")
    page.fill("#id_name", "hello-colony")
    page.fill("#id_command", f"{sys.executable} -c \"import time; print('hello from colony'); time.sleep(7)\"")
    page.fill("#id_gpus", "3")
    page.click("button:has-text('Submit job')")
    assert page.locator("#field-gpus .field-error").inner_text() == "The cluster has 2 GPUs; 3 can never be granted."
    screenshot(page, "submit-refused")
    page.fill("#id_gpus", "1")
    page.fill("#id_gpu_memory", "20 GiB")
    page.click("button:has-text('Submit job')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert "submitted to vision" in page.locator(".flash").inner_text()

    # Other work on the cluster: bob's long job takes the other GPU; alice's 2-GPU job must wait.
    submit_over_api(bob, name="bert-finetune", command=[sys.executable, "-c", "import time; time.sleep(40)"], gpus=1)
    waiting = submit_over_api(alice, name="two-gpu-sweep", command=[sys.executable, "-c", "print(2)"], gpus=2)

    # The queue page follows the job without a reload.
    page.goto(f"{url}/jobs/")
    page.locator(f'tr[data-job-id="{job_id}"] .state').wait_for()
    # Record every state the row shows (the table is redrawn by polling, every 4 s; the job runs 7 s).
    page.evaluate("""id => {
        window.seenStates = [];
        const note = () => {
            const cell = document.querySelector(`tr[data-job-id="${id}"] .state`);
            if (cell && window.seenStates[window.seenStates.length - 1] !== cell.textContent) {
                window.seenStates.push(cell.textContent);
            }
        };
        note();
        new MutationObserver(note).observe(document.getElementById('queue'), {childList: true, subtree: true});
    }""", job_id)
    page.wait_for_function("() => window.seenStates.includes('Running')")
    page.locator(f'tr[data-job-id="{waiting}"] .reason').first.wait_for()
    screenshot(page, "queue")
    # While it runs, its page tails its output live (shipped by the agent, polled by the page).
    live = context.new_page()
    live.goto(f"{url}/jobs/{job_id}/")
    live.wait_for_function("() => document.getElementById('job-live-nodes').textContent.includes('hello from colony')")
    assert live.locator("#job-live").is_visible()
    screenshot(live, "job-live")
    live.close()
    page.wait_for_function("() => window.seenStates.includes('Succeeded')", timeout=40_000)
    seen = page.evaluate("() => window.seenStates")
    assert seen.index("Running") < seen.index("Succeeded"), seen

    # Its page: output, timeline, GPUs, and the memory/utilisation chart from the ingested samples.
    wait_for(lambda: JobRollup.objects.filter(job_id=job_id).exists(), timeout=20, what="job samples ingested")
    page.goto(f"{url}/jobs/{job_id}/")
    assert "hello from colony" in page.locator("#job-output").inner_text()
    assert "browser-node" in page.locator("#allocations").inner_text()
    page.wait_for_selector("#job-chart .main-svg")
    assert page.locator("#cancel-form").is_hidden()
    screenshot(page, "job")

    # The heatmap has data (real rollups from the agent's samples via ingest).
    wait_for(lambda: GpuRollup.objects.exists(), timeout=20, what="GPU rollups")
    page.goto(f"{url}/heatmap/?range=1h")
    page.wait_for_function(CELLS_WITH_DATA)
    page.wait_for_function("() => document.getElementById('heatmap').data[0].text.flat()"
                           ".some(t => t.includes('hello-colony'))")
    cell = cell_of(page, "hello-colony")
    assert cell, "no heatmap cell names the job"
    page.mouse.move(cell["x"], cell["y"])
    page.wait_for_function("() => document.getElementById('cell-info').textContent.includes('hello-colony')")
    screenshot(page, "heatmap")
    # Bob's job shows up for alice as somebody else's, never by name.
    assert page.evaluate("() => document.getElementById('heatmap').data[0].text.flat()"
                         ".some(t => t.includes('another tenant'))")
    assert not page.evaluate("() => document.getElementById('heatmap').data[0].text.flat()"
                             ".some(t => t.includes('bert-finetune'))")
    page.mouse.click(cell["x"], cell["y"])
    page.wait_for_url(re.compile(rf"/jobs/{job_id}/$"))

    # The other pages, as a user would see them.
    for name, path, ready in [
        ("overview", "/", "#tenant-bars .tenant"),
        ("node", "/nodes/browser-node/", "#heatmap .main-svg"),
        ("nodes", "/nodes/", "#nodes"),
        ("usage", "/jobs/usage/", "#usage-chart .main-svg"),
        ("tokens", "/account/tokens/", "main h1"),
        ("api-docs", "/api/docs/", "main table"),
    ]:
        page.goto(f"{url}{path}")
        page.wait_for_selector(ready)
        screenshot(page, name)
    page.goto(f"{url}/")
    page.wait_for_function("() => /\\d \\/ 2/.test(document.getElementById('t-busy').textContent)")
    assert errors == [], errors

    # The operator's admin: tenants with usage against quota.
    admin = browser.new_context(viewport=VIEWPORT).new_page()
    admin.goto(f"{url}/admin/login/?next=/admin/jobs/tenant/")
    admin.fill("input[name=username]", "operator")
    admin.fill("input[name=password]", PASSWORD)
    admin.click("input[type=submit]")
    admin.wait_for_url(re.compile(r"/admin/jobs/tenant/$"))
    screenshot(admin, "admin-tenants")
    assert get_user_model().objects.filter(username="operator").exists()
