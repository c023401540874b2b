"""/nodes/<name>/: which jobs hold each GPU now (named by ``jobs`` through the lookup it installs
into ``monitoring.services.gpu_holders``), to the owner, a teammate and an outsider."""

from __future__ import annotations

import re

from jobs.models import Allocation
from tests.factories import running_job


def _holders(page: str, index: int) -> str:
    row = re.search(rf'<tr data-index="{index}">(.*?)</tr>', page, re.S).group(1)
    return re.sub(r"\s+", " ", re.search(r'<td class="holders">(.*?)</td>', row, re.S).group(1))


def test_holders_are_named_with_tenant_share_and_duty_to_those_who_may_see_them(cluster, alice, bob, charlie,
                                                                                  vision, web):
    whole = running_job(vision, alice, [cluster["a1/0"]], name="big-train")
    quarter = running_job(vision, alice, [cluster["a1/1"]], name="small-eval", milli=250)
    throttled = running_job(vision, alice, [cluster["a1/1"]], name="borrower", milli=250)
    Allocation.objects.filter(job=throttled).update(duty_cycle=0.5)
    suspended = running_job(vision, alice, [cluster["a1/2"]], name="paused")
    Allocation.objects.filter(job=suspended).update(duty_cycle=0.0)

    for reader in (alice, bob):
        page = web(reader).get("/nodes/a1/").content.decode()
        assert f'<a href="/jobs/{whole.pk}/">#{whole.pk} big-train</a> <span class="muted">(vision)</span>' \
            in _holders(page, 0)
        shared = _holders(page, 1)
        assert f"#{quarter.pk} small-eval</a> <span class=\"muted\">(vision, 1/4 GPU)</span>" in shared
        assert f"#{throttled.pk} borrower</a> <span class=\"muted\">(vision, 1/4 GPU, duty 0.50)</span>" in shared
        assert "(vision, suspended)" in _holders(page, 2)
        assert "idle" in _holders(page, 3)

    page = web(charlie).get("/nodes/a1/").content.decode()
    assert _holders(page, 0) == '<span class="muted">another tenant&#x27;s job</span>'
    assert _holders(page, 1).count("another tenant&#x27;s job") == 2
    for name in ("big-train", "small-eval", "borrower", "paused", "vision", f"/jobs/{whole.pk}/"):
        assert name not in page
    assert "idle" in _holders(page, 3)
