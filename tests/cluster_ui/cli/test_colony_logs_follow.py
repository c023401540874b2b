"""``colony logs -f`` against a live server: prints a running job's output as its nodes ship it,
one prefix per node for a multi-node job, and returns once the job has ended."""

from __future__ import annotations

import importlib
import threading
import time

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from agents import protocol
from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services import job_logs
from tests.factories import GpuFactory, JobFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory

main = importlib.import_module("cluster_ui.cli.main")


def ship(redis_client, job, node, text, offset):
    message = protocol.JobOutput(node=node, job_id=job.pk, launch_id="launch-x-0", offset=offset,
                                 length=len(text.encode()), data=text)
    redis_client.xadd(protocol.node_logs_stream(node), protocol.encode(message))
    job_logs.consume_logs(redis_client)


@pytest.fixture
def colony_env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLONY_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setattr(main, "FOLLOW_INTERVAL_S", 0.2)
    return monkeypatch


def test_logs_follow_prints_output_while_the_job_runs(live_server, transactional_db, live_redis, redis_client,
                                                     settings, colony_env, capsys):
    settings.COLONY_AGENT_AUTH = "off"
    vision = TenantFactory(slug="vision")
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    job = JobFactory(tenant=vision, owner=alice, state=JobState.RUNNING)
    for name in ("gpu-01", "gpu-02"):
        Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name=name), index=0))
    colony_env.setenv("COLONY_URL", live_server.url)
    colony_env.setenv("COLONY_TOKEN", Token.objects.create(user=alice).key)
    ship(redis_client, job, "gpu-01", "step 1\nstep", 0)

    def the_job_goes_on():
        try:
            time.sleep(0.6)
            ship(redis_client, job, "gpu-01", " 2\n", 11)
            ship(redis_client, job, "gpu-02", "rank 1 ready\n", 0)
            time.sleep(0.6)
            Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
        finally:
            connection.close()

    thread = threading.Thread(target=the_job_goes_on)
    thread.start()
    started = time.monotonic()
    assert main.main(["logs", "-f", str(job.pk)]) == 0
    thread.join()
    out = capsys.readouterr().out
    # gpu-02 joined later: from then on each node's new lines are prefixed with its name.
    assert out == "step 1\nstep 2\n[gpu-02] rank 1 ready\n", out
    assert time.monotonic() - started < 10
    # Without -f: the output tail, as before.
    assert main.main(["logs", str(job.pk)]) == 0
    assert capsys.readouterr().out.strip() == "(no output)"


def test_logs_without_follow_prints_what_a_running_job_printed_so_far(live_server, transactional_db, live_redis,
                                                                      redis_client, settings, colony_env, capsys,
                                                                      monkeypatch):
    settings.COLONY_AGENT_AUTH = "off"
    # Two chunks an answer, so that reading it all takes several pages.
    monkeypatch.setattr(job_logs.read_chunks, "__defaults__", (None, 2))
    vision = TenantFactory(slug="vision")
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    job = JobFactory(tenant=vision, owner=alice, state=JobState.RUNNING)
    quiet = JobFactory(tenant=vision, owner=alice, state=JobState.RUNNING)
    for name in ("gpu-01", "gpu-02"):
        Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name=name), index=0))
    colony_env.setenv("COLONY_URL", live_server.url)
    colony_env.setenv("COLONY_TOKEN", Token.objects.create(user=alice).key)
    offset = 0
    for text in ("step 1\n", "step 2\n", "step 3\n", "step 4\n", "step 5\n"):
        ship(redis_client, job, "gpu-01", text, offset)
        offset += len(text)
    ship(redis_client, job, "gpu-02", "rank 1 ready\n", 0)

    assert main.main(["logs", str(job.pk)]) == 0
    out = capsys.readouterr().out
    assert out == ("[gpu-01] step 1\n[gpu-01] step 2\n[gpu-01] step 3\n[gpu-01] step 4\n[gpu-01] step 5\n"
                   "[gpu-02] rank 1 ready\n"), out
    assert main.main(["logs", str(quiet.pk)]) == 0
    assert capsys.readouterr().out.strip() == "(no output yet)"
