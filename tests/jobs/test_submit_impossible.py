"""A job that no quota or inventory could ever satisfy is refused at submission (API, and the form
with the API's words), naming the limit on the field at fault, instead of being accepted and left
pending forever: more GPUs than the tenant's ceiling, than the online inventory has of the wanted
models and memory, than ``max_nodes`` nodes hold, or more memory than the wanted models have."""

import pytest

from jobs.models import Job
from monitoring.choices import NodeHealth
from monitoring.models import Node
from tests.factories import GpuFactory, NodeFactory

URL = "/api/v1/jobs/"
JOB = {"command": ["python", "train.py"]}


def refused(response, field: str) -> str:
    assert response.status_code == 400, response.content
    errors = response.json()["error"]["fields"]
    assert list(errors) == [field], errors
    assert not Job.objects.exists()
    return errors[field][0]


@pytest.fixture
def big_cluster(db):
    """Three nodes of 8 x A100-80GB: 24 GPUs, more than the tenant's 16-GPU ceiling."""
    return [GpuFactory(node=NodeFactory(name=f"node-{n}"), index=i) for n in range(1, 4) for i in range(8)]


def test_more_gpus_than_the_tenants_ceiling_is_refused_naming_it_and_who_can_raise_it(api, alice, big_cluster):
    message = refused(api(alice).post(URL, {**JOB, "gpus": 17}, format="json"), "gpus")
    assert "Tenant vision may hold at most 16 GPUs at once (its ceiling, max_gpus)" in message
    assert "a job of 17 GPUs could never start" in message
    assert "An operator can raise the ceiling in the admin" in message


def test_a_job_at_the_ceiling_is_accepted(api, alice, big_cluster):
    assert api(alice).post(URL, {**JOB, "gpus": 16}, format="json").status_code == 201


def test_a_ceiling_below_the_guarantee_still_allows_the_guarantee(api, alice, vision, big_cluster):
    vision.guaranteed_gpus, vision.max_gpus = 20, 20
    vision.save()
    assert api(alice).post(URL, {**JOB, "gpus": 20}, format="json").status_code == 201


def test_a_tenant_with_no_ceiling_left_cannot_ask_for_a_fraction_either(api, alice, vision, big_cluster):
    vision.guaranteed_gpus, vision.max_gpus = 0, 0
    vision.save()
    message = refused(api(alice).post(URL, {**JOB, "gpus": 1, "gpu_milli": 250}, format="json"), "gpus")
    assert "at most 0 GPUs" in message and "a job of 0.25 GPUs could never start" in message


def test_before_anything_registers_nothing_is_refused_on_size(api, alice, db):
    """An empty inventory refuses nothing on size (the job waits, and the scheduler says why)."""
    assert api(alice).post(URL, {**JOB, "gpus": 17}, format="json").status_code == 201


def test_more_gpus_of_a_model_than_the_cluster_has_is_refused(api, alice, inventory):
    message = refused(api(alice).post(URL, {**JOB, "gpus": 5, "gpu_models": ["V100-32GB"]}, format="json"), "gpus")
    assert message == "The cluster has 4 GPUs that fit the request (V100-32GB); 5 can never be granted."


def test_more_gpus_with_that_much_memory_than_the_cluster_has_is_refused(api, alice, inventory):
    message = refused(api(alice).post(URL, {**JOB, "gpus": 9, "gpu_memory_mib": 40000}, format="json"), "gpus")
    assert message.startswith("The cluster has 8 GPUs that fit the request (any model, 40000 MiB)")


def test_memory_above_the_largest_gpu_of_the_wanted_models_is_refused(api, alice, inventory):
    """An A100 has 80 GiB, but the job asks for V100s only: their 32 GiB is the limit."""
    message = refused(api(alice).post(URL, {**JOB, "gpus": 1, "gpu_models": ["V100-32GB"], "gpu_memory_mib": 40000},
                                      format="json"), "gpu_memory_mib")
    assert message == "No V100-32GB GPU has 40000 MiB; the largest has 32768 MiB."


def test_max_nodes_counts_only_gpus_that_fit(api, alice, inventory):
    mid = NodeFactory(name="mid")
    for i in range(4):
        GpuFactory(node=mid, index=i, model="V100-32GB", memory_mib=32768)
    payload = {**JOB, "gpus": 5, "max_nodes": 1, "gpu_models": ["V100-32GB"]}
    message = refused(api(alice).post(URL, payload, format="json"), "gpus")
    assert message == "No 1 node(s) together have 5 GPUs that fit the request; the most is 4."
    assert api(alice).post(URL, {**payload, "max_nodes": 2}, format="json").status_code == 201


def test_a_lost_node_does_not_count(api, alice, inventory):
    Node.objects.filter(name="small").update(state=NodeHealth.LOST)
    message = refused(api(alice).post(URL, {**JOB, "gpus": 9}, format="json"), "gpus")
    assert message == "The cluster has 8 GPUs; 9 can never be granted."
    refused(api(alice).post(URL, {**JOB, "gpus": 1, "gpu_models": ["V100-32GB"]}, format="json"), "gpu_models")


def test_a_model_list_naming_a_present_gpu_is_accepted(api, alice, inventory):
    response = api(alice).post(URL, {**JOB, "gpus": 4, "gpu_models": ["V100-32GB", "A100-80GB"]}, format="json")
    assert response.status_code == 201, response.content


def test_the_form_shows_the_ceiling_on_the_gpus_field(alice, api, big_cluster, client):
    api_message = refused(api(alice).post(URL, {**JOB, "gpus": 17}, format="json"), "gpus")
    client.force_login(alice)
    response = client.post("/jobs/submit/", {"command": "python train.py", "gpus": "17", "gpu_milli": "1000",
                                             "run_as": "auto", "priority": "0"})
    assert response.status_code == 200
    assert response.context["form"].errors["gpus"] == [api_message]
    assert not Job.objects.exists()
