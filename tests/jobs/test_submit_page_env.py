"""The submit page takes what the API takes for a job's environment and its stop: environment
variables (NAME=VALUE lines), the stop signal and the preemption notice, refused for the API's
reasons in the API's words, and shown in the page's ``colony submit`` line (tests/browser)."""

import pytest

from jobs.models import Job

FORM = {"command": "python train.py", "gpus": "1", "gpu_milli": "1000", "run_as": "auto", "priority": "0"}


def form_errors(response) -> dict:
    return {name: list(errors) for name, errors in response.context["form"].errors.items()}


def test_env_lines_signal_and_notice_reach_the_job(alice, cluster, web):
    response = web(alice).post("/jobs/submit/", {
        **FORM, "env": "EPOCHS=3\r\n\r\nOPTS=--lr=3e-4 -v\r\nEMPTY=\r\n", "stop_signal": "SIGUSR1",
        "preempt_grace": "1m30s"})
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get()
    assert job.env == {"EPOCHS": "3", "OPTS": "--lr=3e-4 -v", "EMPTY": ""}
    assert (job.stop_signal, job.preempt_grace_s) == ("SIGUSR1", 90)


def api_env_error(api, user, env: dict) -> str:
    response = api(user).post("/api/v1/jobs/", {"command": ["python", "train.py"], "gpus": 1, "env": env},
                              format="json")
    assert response.status_code == 400, response.content
    return response.json()["error"]["fields"]["env"][0]


@pytest.mark.parametrize("lines, env", [
    ("LD_PRELOAD=/tmp/evil.so", {"LD_PRELOAD": "/tmp/evil.so"}),  # changes what runs inside the job
    ("HOME=/root", {"HOME": "/root"}),  # changes who the job is
    ("COLONY_JOB_ID=7", {"COLONY_JOB_ID": "7"}),  # set by Colony
    ("2FAST=1", {"2FAST": "1"}),  # not a variable name
])
def test_a_refused_name_reads_as_the_api_says_on_the_env_field(alice, cluster, web, api, lines, env):
    response = web(alice).post("/jobs/submit/", {**FORM, "env": lines})
    assert response.status_code == 200 and not Job.objects.exists()
    assert form_errors(response)["env"] == [api_env_error(api, alice, env)]


def test_a_line_without_a_value_or_a_name_twice_is_refused_with_its_line(alice, cluster, web):
    response = web(alice).post("/jobs/submit/", {**FORM, "env": "EPOCHS=3\nVERBOSE"})
    assert form_errors(response)["env"] == ["Line 2: give NAME=VALUE, e.g. EPOCHS=3 (got 'VERBOSE')."]
    response = web(alice).post("/jobs/submit/", {**FORM, "env": "A=1\nA=2"})
    assert form_errors(response)["env"] == ["Line 2: A is given twice."]
    assert not Job.objects.exists()


def test_a_notice_past_the_clusters_limit_reads_as_the_api_says(alice, cluster, web, api, settings):
    settings.COLONY_MAX_PREEMPT_GRACE_S = 60
    response = web(alice).post("/jobs/submit/", {**FORM, "preempt_grace": "2m"})
    refused = api(alice).post("/api/v1/jobs/", {"command": ["python"], "gpus": 1, "preempt_grace_s": 120},
                              format="json").json()["error"]["fields"]["preempt_grace_s"]
    assert form_errors(response)["preempt_grace"] == refused
    assert not Job.objects.exists()


def test_the_page_offers_the_env_field_beside_signal_and_notice(alice, cluster, web):
    page = web(alice).get("/jobs/submit/").content.decode()
    for name in ("env", "stop_signal", "preempt_grace"):
        assert f'id="field-{name}"' in page
    assert '<textarea name="env"' in page
