"""A job is answered (the 201 of a submission, the job and list endpoints) exactly as DRF's own
``Serializer.to_representation`` renders it, though ``JobSerializer`` reads its fields once per
class (``cluster_ui.api.shared_fields.RepresentedOnce``)."""

import json

import pytest
from rest_framework import serializers

from jobs.api.serializers import JobSerializer
from jobs.choices import JobState
from jobs.models import CodeArchive, Job, JobDependency, JobEvent, JobWait
from tests.factories import JobFactory, running_job

URL = "/api/v1/jobs/"


def _read(pk: int) -> Job:
    """The job as the API reads it (``JobViewSet.get_queryset``)."""
    return (Job.objects.select_related("tenant", "owner", "code", "wait").defer("code__data")
            .prefetch_related("allocations__gpu__node", "events", "dependencies").get(pk=pk))


def _drf(job: Job) -> dict:
    """What DRF's generic loop answers for ``job``: every field bound to a serializer of its own."""
    return serializers.Serializer.to_representation(JobSerializer(job), job)


def _same(answer: dict, expected: dict) -> None:
    assert list(answer) == list(expected)  # the same fields in the same order
    assert json.dumps(answer) == json.dumps(expected)


@pytest.fixture
def jobs(alice, bob, vision, inventory):
    """Jobs with every kind of field filled in: waiting with a reason and dependencies, in a code
    archive, running on GPUs, finished with an error."""
    archive = CodeArchive.objects.create(tenant=vision, uploaded_by=alice, sha256="ab" * 32, size=3, data=b"abc")
    done = JobFactory(tenant=vision, owner=bob, state=JobState.FAILED, exit_code=3, error="boom",
                      output_tail="Traceback", gpu_models=["A100-80GB"], env={"A": "1"})
    waiting = JobFactory(tenant=vision, owner=alice, code=archive, priority=3, cpu_milli=1500,
                         mig_profile="1g.10gb", accepts_unfenced=False, preempt_grace_s=30, max_runtime_s=60)
    JobWait.objects.create(job=waiting, reason={"code": "waiting_for_free_gpus", "message": "Waiting for 1 free GPU",
                                                "details": {"free": 0}})
    JobDependency.objects.create(job=waiting, on=done, kind=JobDependency.Kind.ANY)
    running = running_job(vision, alice, inventory[:2])
    JobEvent.objects.create(job=running, attempt=1, kind="placed", at=running.submitted_at, node="big",
                            message="on big")
    return [done, waiting, running]


def test_every_kind_of_job_is_answered_as_drf_answers_it(jobs):
    for job in jobs:
        _same(JobSerializer(_read(job.pk)).data, _drf(_read(job.pk)))


def test_a_submission_answers_the_job_as_drf_renders_it_read_back(api, alice, inventory):
    answer = api(alice).post(URL, {"command": ["python", "train.py"], "gpus": 2, "name": "train"}, format="json")
    assert answer.status_code == 201
    expected = _drf(_read(answer.json()["id"]))
    _same(answer.json(), {**expected, "eta_s": answer.json()["eta_s"]})


def test_the_job_and_list_endpoints_answer_as_drf_renders_them(api, alice, jobs):
    listed = {job["id"]: job for job in api(alice).get(URL).json()["results"]}
    for job in jobs:
        one = api(alice).get(f"{URL}{job.pk}/").json()
        expected = _drf(_read(job.pk))
        _same(one, {**expected, "eta_s": one["eta_s"]})
        _same(listed[job.pk], {**expected, "eta_s": listed[job.pk]["eta_s"]})
