"""Who a job is on its node: its launch names the submitter (and their POSIX name where single
sign-on carried one) inside the command's MAC, and a job may not set the variables that would
change who it is (HOME, USER, LD_PRELOAD...) unless an operator allows them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol, signing
from cluster_ui.sso.models import OidcIdentity
from jobs.models import Job
from jobs.services.scheduling_loop import run_scheduling_cycle
from tests.factories import GpuFactory, JobFactory, NodeFactory

URL = "/api/v1/jobs/"
GOOD = {"name": "train", "command": ["python", "train.py"], "gpus": 1}
SECRET = "c" * 40


@pytest.fixture
def node(db, redis_client, live_redis, settings):
    settings.COLONY_AGENT_SECRET = SECRET
    node = NodeFactory(name="n1")
    for i in range(2):
        GpuFactory(node=node, index=i)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def launches(redis_client) -> list[tuple[dict, protocol.LaunchJob]]:
    entries = [(fields, protocol.decode_command(fields))
               for _id, fields in redis_client.xrange(protocol.command_stream("n1"))]
    return [(fields, command) for fields, command in entries if isinstance(command, protocol.LaunchJob)]


def test_a_launch_names_its_submitter_inside_the_mac(node, alice, redis_client, django_capture_on_commit_callbacks):
    job = JobFactory(gpus=1, owner=alice, tenant=alice.memberships.get().tenant)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    [(fields, launch)] = launches(redis_client)
    assert (launch.job_id, launch.user, launch.posix_user) == (job.pk, "alice", None)
    key = signing.node_key(SECRET, "n1")
    assert signing.verify_command(key, fields[b"m"], fields[b"sig"])
    swapped = fields[b"m"].replace(b'"user":"alice"', b'"user":"bob"')
    assert swapped != fields[b"m"] and not signing.verify_command(key, swapped, fields[b"sig"])


def test_the_identity_providers_posix_name_travels_with_the_launch_and_its_re_sends(
        node, alice, redis_client, django_capture_on_commit_callbacks):
    OidcIdentity.objects.create(user=alice, issuer="https://idp.example", subject="s-1", posix_name="asmith")
    job = JobFactory(gpus=1, owner=alice, tenant=alice.memberships.get().tenant)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    Job.objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(minutes=1))
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()  # re-sends the unstarted launch
    sent = [launch for _fields, launch in launches(redis_client)]
    assert len(sent) == 2 and all((s.user, s.posix_user) == ("alice", "asmith") for s in sent)


@pytest.mark.parametrize("name", ["HOME", "USER", "LOGNAME", "SHELL", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"])
def test_a_job_that_sets_who_it_is_is_refused_at_submission_naming_the_variable(api, alice, name):
    response = api(alice).post(URL, {**GOOD, "env": {name: "/tmp/x", "EPOCHS": "3"}}, format="json")
    assert response.status_code == 400
    words = str(response.json()["error"]["fields"]["env"])
    assert f"Cannot be set: {name} would change who the job is" in words
    assert not Job.objects.exists()


def test_an_operator_may_allow_such_a_variable(api, alice, settings):
    settings.COLONY_JOB_ENV_ALLOWED = ["LD_LIBRARY_PATH"]
    response = api(alice).post(URL, {**GOOD, "env": {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}}, format="json")
    assert response.status_code == 201, response.json()
    response = api(alice).post(URL, {**GOOD, "env": {"LD_PRELOAD": "/tmp/x.so"}}, format="json")
    assert response.status_code == 400
