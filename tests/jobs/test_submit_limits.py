"""A job whose command and env would not fit in a launch is refused at submission (API and form),
naming the limit: otherwise its node refuses the launch on every re-send and the job stays PLACED
forever, holding its GPUs."""

import pytest

from agents import protocol
from jobs.api.serializers import MAX_LAUNCH_PAYLOAD_BYTES, launch_payload_bytes
from jobs.models import Job
from jobs.services.commands import command_fields

LIMIT_WORDS = f"the most is {MAX_LAUNCH_PAYLOAD_BYTES} bytes (48 KiB)"


def fields_of(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["error"]["fields"]


def env_of(total_bytes: int, command: list[str]) -> dict[str, str]:
    """Variables of at most 4096 characters that bring command + env to exactly ``total_bytes``."""
    env, i = {}, 0
    while launch_payload_bytes(command, env) < total_bytes:
        missing = total_bytes - launch_payload_bytes(command, {**env, f"V{i}": ""})
        env[f"V{i}"] = "S" * max(0, min(4096, missing))
        i += 1
    assert launch_payload_bytes(command, env) == total_bytes
    return env


def test_the_api_refuses_an_env_that_would_not_fit_in_a_launch(alice, api, inventory):
    env = {f"V{i}": "S" * 4000 for i in range(20)}  # 80 kB: each value within the per-variable bound
    errors = fields_of(api(alice).post("/api/v1/jobs/", {"command": ["python", "train.py"], "gpus": 1, "env": env},
                                       format="json"))
    assert list(errors) == ["env"]
    assert LIMIT_WORDS in errors["env"][0]
    assert not Job.objects.exists()


def test_the_api_refuses_a_command_that_would_not_fit_in_a_launch(alice, api, inventory):
    command = ["python", "train.py", *["x" * 4000] * 15]
    errors = fields_of(api(alice).post("/api/v1/jobs/", {"command": command, "gpus": 1, "env": {"A": "1"}},
                                       format="json"))
    assert list(errors) == ["command"]
    assert LIMIT_WORDS in errors["command"][0]


def test_multibyte_text_counts_in_bytes(alice, api, inventory):
    env = {f"V{i}": "é" * 4000 for i in range(7)}  # 28,000 characters, 56,000 bytes
    errors = fields_of(api(alice).post("/api/v1/jobs/", {"command": ["python"], "gpus": 1, "env": env},
                                       format="json"))
    assert LIMIT_WORDS in errors["env"][0]


def test_a_job_at_the_limit_is_accepted_and_its_launch_reaches_the_node(alice, api, inventory):
    command = ["python", "train.py"]
    env = env_of(MAX_LAUNCH_PAYLOAD_BYTES, command)
    response = api(alice).post("/api/v1/jobs/", {"command": command, "gpus": 1, "env": env}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    # The biggest launch the control plane could make of it (64 GPUs, rendezvous variables, every
    # optional field, a MAC) still decodes on the node.
    launch = protocol.LaunchJob(
        command_id=f"launch-{job.pk}-{protocol.MAX_ATTEMPT}", attempt=protocol.MAX_ATTEMPT, job_id=job.pk,
        argv=job.command, gpu_indices=list(range(64)),
        env={**job.env, "MASTER_ADDR": "n" * 63, "MASTER_PORT": "65535", "WORLD_SIZE": "4096",
             "NODE_RANK": "4095", "COLONY_RANK_BASE": "4095"},
        gpu_memory_limit_mib=protocol.MEMORY_MIB_MAX, duty_cycle=0.123456789, tenant="t" * 50,
        max_runtime_s=protocol.MAX_RUNTIME_S, stop_grace_s=600.0)
    fields = command_fields("n" * 63, launch)
    assert protocol.decode_command(fields).env == launch.env


def test_the_form_refuses_it_with_the_apis_words(alice, api, inventory, client):
    command = ["python", "train.py", *["x" * 4000] * 15]
    api_errors = fields_of(api(alice).post("/api/v1/jobs/", {"command": command, "gpus": 1}, format="json"))
    client.force_login(alice)
    response = client.post("/jobs/submit/", {"command": " ".join(command), "gpus": "1", "gpu_milli": "1000",
                                             "run_as": "auto", "priority": "0"})
    assert response.status_code == 200
    form_errors = {name: list(errors) for name, errors in response.context["form"].errors.items()}
    assert form_errors["command"] == api_errors["command"]
    assert LIMIT_WORDS in form_errors["command"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize("size", [MAX_LAUNCH_PAYLOAD_BYTES - 1, MAX_LAUNCH_PAYLOAD_BYTES + 1])
def test_the_boundary(alice, api, inventory, size):
    command = ["python"]
    response = api(alice).post("/api/v1/jobs/", {"command": command, "gpus": 1, "env": env_of(size, command)},
                               format="json")
    assert response.status_code == (201 if size <= MAX_LAUNCH_PAYLOAD_BYTES else 400), response.content
