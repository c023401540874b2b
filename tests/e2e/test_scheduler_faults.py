"""Faults with real processes: two workers each with its own beat, one of them killed with
SIGKILL while jobs flow. Every job still runs exactly once and no GPU is ever held twice."""

import os
import signal
import sys
from collections import defaultdict

import pytest
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.models import Allocation, Job
from tests.e2e.conftest import WORKER_ARGV, wait_for
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e


def test_two_schedulers_and_a_killed_worker_place_every_job_exactly_once(stack, transactional_db, tmp_path):
    second = stack.start("worker2", [*WORKER_ARGV, "-n", "worker2@%h", "-s", str(tmp_path / "beat-schedule-2")])
    user = MembershipFactory(user=UserFactory(username="alice"),
                             tenant=TenantFactory(slug="vision", guaranteed_gpus=2, max_gpus=2)).user
    api = APIClient()
    api.force_authenticate(user)
    ids = [api.post("/api/v1/jobs/", {"command": [sys.executable, "-c", "import time; time.sleep(1)"], "gpus": 1},
                    format="json").json()["id"] for _ in range(8)]
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() >= 2, timeout=40, what="first jobs")
    first_worker = next(p for name, p in stack.started if name == "worker")
    os.killpg(first_worker.pid, signal.SIGKILL)  # no warm shutdown: mid-whatever it was doing
    wait_for(lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 8, timeout=90,
             what="all jobs to succeed after the kill")
    assert second.poll() is None

    allocations = list(Allocation.objects.filter(job_id__in=ids).order_by("created_at"))
    per_job = defaultdict(int)
    for allocation in allocations:
        per_job[allocation.job_id] += 1
    assert set(per_job.values()) == {1}, "a job was placed twice"
    per_gpu = defaultdict(list)
    for allocation in allocations:
        per_gpu[allocation.gpu_id].append((allocation.created_at, allocation.released_at))
    for spans in per_gpu.values():
        for (_, released), (created, _) in zip(spans, spans[1:]):
            assert released <= created, "a GPU was held by two jobs at once"
