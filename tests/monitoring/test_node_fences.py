"""Which fences each node's jobs have (``NodeRegistered.job_fences``), from a real agent's
registration through the fan-in and the agent-event reader to where operators read them: the node
list, the node page, the node API and ``/metrics`` (``colony_node_fenced{node,fence}``). A node
whose agent predates the report is "unknown", never "unfenced" nor "fenced"."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from agents.accounts import RunAsPolicy
from agents.agent import Agent
from agents.backends.simulated import SimulatedBackend
from agents.runner import JobRunner
from jobs.services.agent_events import consume_events
from monitoring.models import Node
from monitoring.services import fanin
from tests.agents.conftest import RunningAgent
from tests.agents.helpers import wait_for

TOKEN = "m" * 40


def register(redis_client, node: str, **fields) -> None:
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.NodeRegistered(
        node=node, gpus=[protocol.GpuInfo(index=0, uuid=f"GPU-{node}-0", model="H100-80GB", memory_mib=81559)],
        backend="nvml", agent_version="t", hostname=node, **fields)))
    assert consume_events(redis_client) == 1


def register_as_an_older_agent(redis_client, node: str) -> None:
    """A registration as an agent from before ``job_fences`` writes it: without the field."""
    fields = protocol.encode(protocol.NodeRegistered(
        node=node, gpus=[protocol.GpuInfo(index=0, uuid=f"GPU-{node}-0", model="H100-80GB", memory_mib=81559)],
        backend="nvml", agent_version="0.9", hostname=node))
    message = json.loads(fields["m"])
    del message["job_fences"]
    redis_client.xadd(protocol.EVENTS_STREAM, {"m": json.dumps(message)})
    assert consume_events(redis_client) == 1


def badge(page: str, where: str) -> tuple[str, str]:
    """The fences badge inside the element ``where`` matches first: (its state, its words)."""
    scope = re.search(where, page, re.S).group(0)
    found = re.search(r'<span class="state fence-[^"]*" data-fencing="(\w+)"[^>]*>([^<]*)</span>', scope)
    return found.group(1), found.group(2)


def list_badge(page: str, node: str) -> tuple[str, str]:
    return badge(page, rf'<tr data-node="{node}">.*?</tr>')


def node_badge(page: str) -> tuple[str, str]:
    return badge(page, r'<p class="fences">.*?</p>')


@pytest.fixture
def scrape(client, settings):
    settings.COLONY_METRICS_TOKEN = TOKEN

    def read() -> dict:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        return {tuple(sorted(s.labels.items())): s.value for family in
                text_string_to_metric_families(response.content.decode())
                for s in family.samples if s.name == "colony_node_fenced"}

    return read


def test_a_real_agents_fences_reach_the_node_pages_the_api_and_metrics(
        db, redis_url, redis_client, live_redis, tmp_path, web, api, alice, scrape):
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True))
    agent = Agent("f1", SimulatedBackend("2xT4-16GB", "f1"), redis_url, runner, interval=0.1, heartbeat_ttl=5,
                  shutdown_grace=1.0, job_fences=("cgroup", "devices", "accounts"))
    running = RunningAgent(agent)
    try:
        def registered():
            fanin.fan_in(redis_client, "events")
            consume_events(redis_client)
            return Node.objects.filter(name="f1").exists()

        wait_for(registered, timeout=30)
    finally:
        running.stop()
    assert Node.objects.get(name="f1").job_fences == ["cgroup", "devices", "accounts"]
    listed = web(alice).get("/nodes/").content.decode()
    assert list_badge(listed, "f1") == ("fenced", "fenced: cgroup, devices, accounts")
    assert node_badge(web(alice).get("/nodes/f1/").content.decode()) == ("fenced", "fenced: cgroup, devices, accounts")
    node = api(alice).get("/api/v1/nodes/f1/").json()
    assert (node["job_fences"], node["fencing"]) == (["cgroup", "devices", "accounts"], "fenced")
    assert scrape() == {(("fence", "accounts"), ("node", "f1")): 1.0, (("fence", "cgroup"), ("node", "f1")): 1.0,
                        (("fence", "devices"), ("node", "f1")): 1.0}


def test_a_node_without_a_device_filter_is_shown_unfenced_saying_what_it_lacks(
        db, redis_client, live_redis, web, api, alice, scrape):
    register(redis_client, "c1", job_fences=["accounts", "cgroup"])  # (any order on the wire)
    register(redis_client, "bare", job_fences=[])
    listed = web(alice).get("/nodes/").content.decode()
    assert list_badge(listed, "c1") == ("unfenced", "unfenced: no device fence")
    assert list_badge(listed, "bare") == ("unfenced", "unfenced: no job cgroup, no device fence")
    page = web(alice).get("/nodes/c1/").content.decode()
    assert node_badge(page) == ("unfenced", "unfenced: no device fence")
    node = api(alice).get("/api/v1/nodes/c1/").json()
    assert (node["job_fences"], node["fencing"]) == (["cgroup", "accounts"], "unfenced")
    metrics = scrape()
    assert metrics[(("fence", "devices"), ("node", "c1"))] == 0.0
    assert metrics[(("fence", "cgroup"), ("node", "c1"))] == 1.0
    assert {fence: value for labels, value in metrics.items() for (_, fence), (_, node) in [labels]
            if node == "bare"} == {"cgroup": 0.0, "devices": 0.0, "accounts": 0.0}


def test_a_node_whose_agent_predates_the_report_is_unknown_not_unfenced(
        db, redis_client, live_redis, web, api, alice, scrape):
    register(redis_client, "old", job_fences=["cgroup", "devices"])
    register_as_an_older_agent(redis_client, "old")  # downgraded: what it had is no longer known
    assert Node.objects.get(name="old").job_fences is None
    assert list_badge(web(alice).get("/nodes/").content.decode(), "old") == ("unknown", "unknown")
    assert node_badge(web(alice).get("/nodes/old/").content.decode()) == ("unknown", "unknown")
    node = api(alice).get("/api/v1/nodes/old/").json()
    assert (node["job_fences"], node["fencing"]) == (None, "unknown")
    assert scrape() == {}  # no series: an alert on a 0 must not fire on what nobody knows
