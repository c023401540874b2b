"""Agent authentication at metric ingest: a sample counts only when it is signed with the key of
the node it names (COLONY_AGENT_AUTH=required); anything else is dead-lettered and changes nothing."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import protocol, signing
from monitoring.models import Alert, GpuRollup, JobRollup, JobUsage
from monitoring.services import live
from agents.streams import dead_letter_count
from monitoring.services.ingest import GROUP, Ingestor, ingest_stats
from tests.factories import GpuFactory, NodeFactory
from tests.monitoring.conftest import place_job

SECRET = "monitoring-test-secret-0123456789"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def auth_required(settings):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"


@pytest.fixture
def auth_off(settings):
    settings.COLONY_AGENT_SECRET = ""
    settings.COLONY_AGENT_AUTH = "off"


@pytest.fixture
def nodes(db):
    """Two registered nodes, ``node-a`` and ``node-b``, one GPU each."""
    for name in ("node-a", "node-b"):
        GpuFactory(node=NodeFactory(name=name), index=0, uuid=f"GPU-{name}")


@pytest.fixture
def ingestor(redis_client, live_redis, nodes):
    return Ingestor(redis_client, consumer="test")


def sample(node="node-a", hot=False) -> protocol.NodeSample:
    return protocol.NodeSample(
        node=node, ts=time.time(), seq=1,
        gpus=[protocol.GpuSample(index=0, util_sm=99.0, mem_used_mib=70000, temperature_c=120.0 if hot else 60.0,
                                 xid_events=[79] if hot else [])],
        jobs=[protocol.JobGpuSample(job_id=7, gpu_index=0, mem_used_mib=70000, util_sm=99.0)],
        running_jobs=[7],
    )


def post(redis_client, message, signer: str | None):
    """XADD ``message`` signed with ``signer``'s key (None: unsigned), as that node's agent would."""
    key = signing.node_key(SECRET, signer) if signer else None
    redis_client.xadd(protocol.METRICS_STREAM, signing.signed(protocol.encode(message), key))


def nothing_stored(redis_client) -> bool:
    return not (GpuRollup.objects.exists() or JobRollup.objects.exists() or JobUsage.objects.exists()
                or Alert.objects.exists() or live.latest_nodes(redis_client) or live.latest_gpus(redis_client))


def reasons(redis_client) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in redis_client.xrange(protocol.DEAD_LETTER_STREAM)]


def test_a_sample_signed_by_node_b_but_naming_node_a_is_dead_lettered_and_changes_nothing(
        auth_required, ingestor, redis_client):
    post(redis_client, sample("node-a", hot=True), signer="node-b")
    result = ingestor.run_once()
    assert (result.entries, result.samples, result.dead) == (1, 0, 1)
    assert reasons(redis_client) == ["bad signature for node node-a"]
    assert dead_letter_count(redis_client) == 1
    assert nothing_stored(redis_client)
    assert redis_client.xpending(protocol.METRICS_STREAM, GROUP)["pending"] == 0


def test_a_signed_sample_whose_bytes_were_changed_is_dead_lettered(auth_required, ingestor, redis_client):
    key = signing.node_key(SECRET, "node-a")
    fields = signing.signed(protocol.encode(sample("node-a")), key)
    fields["m"] = fields["m"].replace('"util_sm":99.0', '"util_sm":1.0')
    redis_client.xadd(protocol.METRICS_STREAM, fields)
    assert ingestor.run_once().dead == 1
    assert reasons(redis_client) == ["bad signature for node node-a"]
    assert nothing_stored(redis_client)


def test_an_unsigned_sample_is_dead_lettered_when_authentication_is_required(auth_required, ingestor, redis_client):
    post(redis_client, sample("node-a"), signer=None)
    assert ingestor.run_once().dead == 1
    assert reasons(redis_client) == ["unsigned message (agent authentication is required)"]
    assert nothing_stored(redis_client)


def test_an_unsigned_sample_is_applied_when_authentication_is_off(auth_off, ingestor, redis_client):
    post(redis_client, sample("node-a"), signer=None)
    result = ingestor.run_once()
    assert (result.samples, result.dead) == (1, 0)
    assert GpuRollup.objects.filter(gpu__node__name="node-a").exists()


def test_a_correctly_signed_sample_is_applied(auth_required, ingestor, redis_client):
    place_job(7, "node-a")
    place_job(7, "node-b")
    post(redis_client, sample("node-a"), signer="node-a")
    post(redis_client, sample("node-b"), signer="node-b")
    result = ingestor.run_once()
    assert (result.samples, result.dead) == (2, 0)
    assert set(GpuRollup.objects.values_list("gpu__node__name", flat=True)) == {"node-a", "node-b"}
    assert JobUsage.objects.get(job_id=7).peak_gpu_memory_mib == 70000
    assert set(live.latest_nodes(redis_client)) == {"node-a", "node-b"}
    assert ingest_stats(redis_client)["samples"] == 2


def test_forged_and_genuine_samples_in_one_batch_apply_only_the_genuine(auth_required, ingestor, redis_client):
    post(redis_client, sample("node-a", hot=True), signer="node-b")
    post(redis_client, sample("node-b"), signer="node-b")
    result = ingestor.run_once()
    assert (result.samples, result.dead) == (1, 1)
    assert set(GpuRollup.objects.values_list("gpu__node__name", flat=True)) == {"node-b"}
    assert not Alert.objects.exists()  # the forged overheating of node-a raised nothing


# ---------------------------------------------------------------- settings


def _manage_check(**env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_AGENT_")}
    environ.update(DJANGO_SETTINGS_MODULE="cluster_ui.settings", **env)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("env, error", [
    ({"COLONY_AGENT_AUTH": "required"}, "needs COLONY_AGENT_SECRET"),
    ({"COLONY_AGENT_SECRET": "too-short"}, "at least 16 characters"),
    ({"COLONY_AGENT_AUTH": "maybe", "COLONY_AGENT_SECRET": SECRET}, "use 'required' or 'off'"),
])
def test_settings_refuse_required_authentication_without_a_usable_secret(env, error):
    result = _manage_check(**env)
    assert result.returncode != 0 and error in result.stderr


def test_authentication_is_required_once_a_secret_is_set(tmp_path):
    secret_file = tmp_path / "agent_secret"
    secret_file.write_text(SECRET + "\n")
    code = "from cluster_ui import settings; print(settings.COLONY_AGENT_AUTH, settings.COLONY_AGENT_SECRET)"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_AGENT_")}
    environ.update(DJANGO_SETTINGS_MODULE="cluster_ui.settings", COLONY_AGENT_SECRET_FILE=str(secret_file))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["required", SECRET], result.stderr
