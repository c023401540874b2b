"""CPU cores and host memory end to end: the agent registers what its node offers, researchers ask
for cores and RAM (API, with a per-GPU default), requests no node could feed are refused at
submission, and the scheduling loop keeps a node's GPUs idle rather than starve them of CPU,
telling the waiting job why."""

import pytest

from agents import protocol
from agents.protocol import GpuInfo, NodeRegistered
from jobs.models import Job
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.models import Node
from monitoring.services.registry import register_node

URL = "/api/v1/jobs/"
JOB = {"command": ["python", "train.py"]}


def register(name: str, gpus: int, cpus: float | None, memory_gib: int | None = None) -> Node:
    return register_node(NodeRegistered(
        node=name, backend="simulated", agent_version="0.1.0", hostname=name,
        gpus=[GpuInfo(index=i, uuid=f"{name}-gpu-{i}", model="A100-80GB", memory_mib=81920) for i in range(gpus)],
        cpu_milli=None if cpus is None else int(cpus * 1000),
        host_memory_mib=None if memory_gib is None else memory_gib * 1024))


@pytest.fixture
def node16(db, redis_client, live_redis):
    """One node with 4 GPUs but only 16 cores and 64 GiB offered to jobs, heartbeating."""
    node = register("n1", gpus=4, cpus=16, memory_gib=64)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def test_the_agents_registration_records_what_the_node_offers(db):
    node = register("n1", gpus=2, cpus=30, memory_gib=240)
    assert (node.cpu_milli, node.host_memory_mib) == (30_000, 240 * 1024)


def test_a_registration_with_absurd_figures_is_refused_by_the_protocol():
    with pytest.raises(ValueError):
        NodeRegistered(node="n1", backend="simulated", agent_version="0.1.0", hostname="n1", gpus=[],
                       cpu_milli=-1)
    with pytest.raises(ValueError):
        NodeRegistered(node="n1", backend="simulated", agent_version="0.1.0", hostname="n1", gpus=[],
                       host_memory_mib=protocol.HOST_MEMORY_MIB_MAX + 1)


def test_cores_and_memory_asked_through_the_api_are_stored_and_shown(api, alice, node16):
    response = api(alice).post(URL, {**JOB, "gpus": 1, "cpus": "2.5", "host_memory_mib": 8192}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.cpu_milli, job.host_memory_mib) == (2500, 8192)
    shown = api(alice).get(f"{URL}{job.pk}/").json()
    assert (shown["cpus"], shown["host_memory_mib"]) == (2.5, 8192)


def test_a_job_that_does_not_say_gets_the_per_gpu_default(api, alice, node16, settings):
    settings.COLONY_DEFAULT_CPUS_PER_GPU = 4
    settings.COLONY_DEFAULT_HOST_MEMORY_MIB_PER_GPU = 16384
    assert api(alice).post(URL, {**JOB, "gpus": 2}, format="json").status_code == 201
    assert api(alice).post(URL, {**JOB, "gpus": 1, "gpu_milli": 250}, format="json").status_code == 201
    assert list(Job.objects.order_by("pk").values_list("cpu_milli", "host_memory_mib")) == [
        (8000, 32768), (1000, 4096)]


@pytest.mark.parametrize("ask, field, words", [
    ({"cpus": 17}, "cpus", "No node offers 17 CPU cores; the largest offers 16."),
    ({"host_memory_mib": 65537}, "host_memory_mib", "No node offers 65537 MiB of host memory"),
    ({"cpus": -1}, "cpus", "greater than or equal to 0"),
])
def test_more_than_any_node_offers_is_refused_naming_the_field(api, alice, node16, ask, field, words):
    response = api(alice).post(URL, {**JOB, "gpus": 1, **ask}, format="json")
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]["fields"][field][0]
    assert not Job.objects.exists()


def test_the_loop_leaves_gpus_idle_rather_than_starve_them_of_cpu(api, alice, node16,
                                                                  django_capture_on_commit_callbacks):
    for _ in range(3):
        assert api(alice).post(URL, {**JOB, "gpus": 1, "cpus": 6}, format="json").status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    placed = Job.objects.filter(state="PLACED").count()
    waiting = Job.objects.get(state="PENDING")
    assert placed == 2  # 6 + 6 of 16 cores; a third would need 18, though two GPUs are free
    shown = api(alice).get(f"{URL}{waiting.pk}/").json()["pending_reason"]
    assert shown["code"] == "insufficient_cpu"
    assert "6 CPU cores" in shown["message"]


def test_the_submit_form_asks_for_cores_and_memory_and_the_job_page_shows_them(client, alice, node16):
    client.force_login(alice)
    response = client.post("/jobs/submit/", {"command": "python train.py", "gpus": "1", "gpu_milli": "1000",
                                             "run_as": "auto", "cpus": "4", "host_memory": "32 GiB",
                                             "stop_signal": "SIGTERM"})
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert (job.cpu_milli, job.host_memory_mib) == (4000, 32768)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "4 CPU cores · 32 GiB of host memory" in page


def test_the_form_says_which_field_is_wrong(client, alice, node16):
    client.force_login(alice)
    page = client.post("/jobs/submit/", {"command": "python train.py", "gpus": "1", "gpu_milli": "1000",
                                         "run_as": "auto", "cpus": "40", "host_memory": "lots",
                                         "stop_signal": "SIGTERM"}).content.decode()
    assert "Not a size: &#x27;lots&#x27; (a number and a unit: 512MiB, 20GiB, 1.5T" in page
    assert not Job.objects.exists()
