"""A job's CPU and host memory request travels in its launch (inside the command's MAC), as the
share of it the node was placed with: the node caps the job's cgroup at it (``memory.max``,
``cpu.max``; the agent side is ``tests/agents/test_job_host_limits.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol, signing
from jobs.models import Job
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory

SECRET = "c" * 40


@pytest.fixture
def nodes(db, redis_client, live_redis, settings):
    """Two nodes of two GPUs each, alive."""
    settings.COLONY_AGENT_SECRET = SECRET
    for name in ("n1", "n2"):
        node = NodeFactory(name=name)
        for i in range(2):
            GpuFactory(node=node, index=i)
        redis_client.set(protocol.heartbeat_key(name), "{}", ex=60)


def launches(redis_client, node: str) -> list[tuple[dict, protocol.LaunchJob]]:
    entries = [(fields, protocol.decode_command(fields))
               for _id, fields in redis_client.xrange(protocol.command_stream(node))]
    return [(fields, command) for fields, command in entries if isinstance(command, protocol.LaunchJob)]


def place(capture) -> None:
    with capture(execute=True):
        run_scheduling_cycle()


def test_a_jobs_cpu_and_host_memory_request_is_in_its_launch_and_its_re_sends(
        nodes, alice, redis_client, django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1, owner=alice, tenant=alice.memberships.get().tenant, cpu_milli=2500,
                     host_memory_mib=16384)
    place(django_capture_on_commit_callbacks)
    Job.objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(minutes=1))
    place(django_capture_on_commit_callbacks)  # re-sends the unstarted launch
    node = Job.objects.get(pk=job.pk).allocations.get().gpu.node.name
    sent = launches(redis_client, node)
    assert len(sent) == 2
    assert all((launch.host_memory_mib, launch.cpu_milli) == (16384, 2500) for _fields, launch in sent)
    fields, launch = sent[0]
    assert signing.verify_command(signing.node_key(SECRET, node), fields[b"m"], fields[b"sig"])
    smaller = fields[b"m"].replace(b'"host_memory_mib":16384', b'"host_memory_mib":1')
    assert smaller != fields[b"m"] and not signing.verify_command(signing.node_key(SECRET, node), smaller,
                                                                  fields[b"sig"])


def test_a_job_that_asks_for_no_cpu_or_host_memory_gets_no_limits(
        nodes, alice, redis_client, django_capture_on_commit_callbacks):
    JobFactory(gpus=1, owner=alice, tenant=alice.memberships.get().tenant)
    place(django_capture_on_commit_callbacks)
    [(_fields, launch)] = launches(redis_client, "n1") + launches(redis_client, "n2")
    assert (launch.host_memory_mib, launch.cpu_milli) == (None, None)


def test_a_gang_over_two_nodes_gets_each_nodes_share_in_proportion_to_its_gpus_there(
        nodes, alice, redis_client, django_capture_on_commit_callbacks):
    JobFactory(gpus=3, owner=alice, tenant=alice.memberships.get().tenant, cpu_milli=3000, host_memory_mib=10000)
    place(django_capture_on_commit_callbacks)
    sent = [launch for node in ("n1", "n2") for _fields, launch in launches(redis_client, node)]
    # 3 GPUs over two 2-GPU nodes: 2 on one, 1 on the other; per GPU ceil(10000 / 3) MiB and 1 core,
    # as the scheduler counted them on each node.
    assert sorted((len(s.gpu_indices), s.host_memory_mib, s.cpu_milli) for s in sent) == [
        (1, 3334, 1000), (2, 6668, 2000)]
