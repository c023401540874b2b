"""``manage.py export_trace`` then ``manage.py simulate``: replay last week under proposed quotas."""

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.scheduling.simulate.trace import read_colony_trace
from monitoring.models import JobUsage
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def last_week(db):
    vision = TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=4)
    nlp = TenantFactory(slug="nlp", guaranteed_gpus=2)
    node = NodeFactory(name="big", rack="r7")
    for index in range(4):
        GpuFactory(node=node, index=index)
    now = timezone.now()
    ran = []
    for i, (tenant, gpus, state) in enumerate([(vision, 2, JobState.SUCCEEDED), (nlp, 1, JobState.FAILED),
                                               (vision, 4, JobState.SUCCEEDED)]):
        started = now - timedelta(days=2, hours=-i)
        job = JobFactory(tenant=tenant, gpus=gpus, state=state, gpu_memory_mib=20000, priority=i,
                         started_at=started, finished_at=started + timedelta(minutes=30 + i))
        Job.objects.filter(id=job.id).update(submitted_at=started - timedelta(minutes=5))
        ran.append(job)
    JobUsage.objects.create(job_id=ran[0].id, peak_gpu_memory_mib=12000, util_sum=150.0, util_n=3,
                            first_seen_at=now, last_seen_at=now)
    never_ran = JobFactory(tenant=nlp, state=JobState.CANCELLED)  # cancelled while pending: not in the trace
    old = JobFactory(tenant=nlp, state=JobState.SUCCEEDED, started_at=now - timedelta(days=20),
                     finished_at=now - timedelta(days=20))
    Job.objects.filter(id=old.id).update(submitted_at=now - timedelta(days=20))
    return ran, never_ran


def test_export_writes_the_jobs_that_ran_with_their_runtimes_usage_nodes_and_quotas(last_week, tmp_path):
    ran, _ = last_week
    out = tmp_path / "week.json"
    call_command("export_trace", "--days", "7", "--out", str(out))
    trace = read_colony_trace(out)
    assert [job.id for job in trace.jobs] == [job.id for job in ran]
    first = trace.jobs[0]
    assert first.submit_s == 0.0 and first.tenant == "vision" and first.gpus == 2
    assert first.duration_s == pytest.approx(30 * 60)
    assert first.memory_mib == 12000 and first.utilisation == pytest.approx(0.5)  # measured, not requested
    assert trace.jobs[1].memory_mib == 20000 and trace.jobs[1].utilisation == 1.0  # no measurement: the request
    assert trace.jobs[1].submit_s == pytest.approx(3600)
    assert [(n.name, n.gpus, n.rack) for n in trace.nodes] == [("big", 4, "r7")]
    assert {(q.name, q.guaranteed_gpus) for q in trace.quotas} == {("vision", 2), ("nlp", 2)}


def test_exported_week_replays_under_a_proposed_quota_file(last_week, tmp_path):
    out, quotas, report = tmp_path / "week.json", tmp_path / "proposed.json", tmp_path / "replay"
    call_command("export_trace", "--days", "7", "--out", str(out))
    quotas.write_text(json.dumps({"tenants": {"vision": {"guaranteed_gpus": 4, "max_gpus": 4}}}))
    run = subprocess.run([sys.executable, "manage.py", "simulate", "--trace", str(out), "--quota-file", str(quotas),
                          "--policies", "fair_share,fifo_exclusive", "--out", str(report)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "ratios are to fifo_exclusive" in run.stdout
    document = json.loads((report / "replay.json").read_text())
    assert {q["tenant"]: q["guaranteed_gpus"] for q in document["quotas"]} == {"vision": 4, "nlp": 0}
    assert set(document["policies"]) == {"fair_share", "fifo_exclusive"}
    assert all(run["finished"] == 3 for run in document["policies"].values())


def test_export_refuses_an_empty_window(db, tmp_path):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="window is empty"):
        call_command("export_trace", "--since", "2026-11-20T00:00:00Z", "--until", "2026-11-19T00:00:00Z",
                     "--out", str(tmp_path / "x.json"))
