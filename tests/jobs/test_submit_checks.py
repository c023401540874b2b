"""A job spec is checked exactly as DRF's own loop checks it, field by field on fields bound to the
serializer, though ``JobSubmitSerializer`` checks a JSON object on fields shared by every request
and only the fields it gives, the required ones and those with a default
(``cluster_ui.api.shared_fields.CheckedOnSharedFields``): the same jobs accepted, the same refusals."""

import pytest
from django.http import QueryDict
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from jobs.api.serializers import JobSubmitSerializer
from jobs.services.submission import submission_context

OK = {"command": ["python", "train.py"], "gpus": 1}

SPECS = [
    {}, [], "python", OK, {**OK, "gpu": 2}, {"command": [], "gpus": 1}, {"command": ["python"]}, {"gpus": 1},
    {**OK, "name": "x" * 201}, {**OK, "name": 3}, {**OK, "name": None}, {**OK, "env": {"A": "1", "COLONY_X": "2"}},
    {**OK, "env": "A=1"}, {**OK, "env": {"1A": "x"}}, {**OK, "env": None}, {**OK, "gpus": 0}, {**OK, "gpus": "two"},
    {**OK, "gpus": None}, {**OK, "gpu_milli": 250}, {**OK, "gpu_milli": 250, "gpus": 2}, {**OK, "gpu_milli": None},
    {**OK, "gpu_memory_mib": 40960}, {**OK, "gpu_memory_mib": None}, {**OK, "gpu_memory_mib": 10 ** 9},
    {**OK, "cpus": "1.5"}, {**OK, "cpus": 0.5}, {**OK, "cpus": "many"}, {**OK, "cpus": None},
    {**OK, "host_memory_mib": 1024}, {**OK, "gpu_models": ["A100-80GB"]}, {**OK, "gpu_models": "A100-80GB"},
    {**OK, "gpu_models": ["H100"]}, {**OK, "mig_profile": ""}, {**OK, "mig_profile": None},
    {**OK, "mig_profile": "1g.10gb"}, {**OK, "accepts_unfenced": None}, {**OK, "accepts_unfenced": "yes"},
    {**OK, "priority": 11}, {**OK, "priority": -3}, {**OK, "opportunistic_only": True}, {**OK, "shareable": "maybe"},
    {**OK, "max_nodes": 1}, {**OK, "max_nodes": None}, {**OK, "max_runtime_s": 0}, {**OK, "profile_key": "k"},
    {**OK, "tenant": "vision"}, {**OK, "tenant": "nlp"}, {**OK, "tenant": "not a slug"}, {**OK, "tenant": None},
    {**OK, "workdir": "relative"}, {**OK, "workdir": "/shared/w", "code": "ab" * 32}, {**OK, "code": "ab" * 32},
    {**OK, "image": "pytorch/pytorch:2.4"}, {**OK, "venv": "/v", "conda": "/c"}, {**OK, "preempt_grace_s": -1},
    {**OK, "stop_signal": "SIGKILL"}, {**OK, "stop_signal": "SIGINT"}, {**OK, "checkpoints": 1},
    {**OK, "array": "0-3"}, {**OK, "array": "3-0"}, {**OK, "array": ""}, {**OK, "after_ok": [0]},
    {**OK, "after_ok": [10 ** 6]}, {**OK, "after_any": "1"}, {**OK, "after_ok": None},
]


class CheckedByDrf(JobSubmitSerializer):
    """DRF's generic loop: every writable field, on copies bound to this instance."""

    _writable_fields = serializers.Serializer._writable_fields

    def known_field_names(self):
        return self.fields.keys()


def _outcome(serializer_class, spec, context) -> tuple:
    checked = serializer_class(data=spec, context=dict(context))
    if checked.is_valid():
        return True, repr(sorted(checked.validated_data.items()))
    return False, repr(checked.errors)


@pytest.fixture
def context(alice, nlp, inventory):
    from tests.factories import MembershipFactory

    MembershipFactory(user=alice, tenant=nlp)
    request = Request(APIRequestFactory().post("/api/v1/jobs/"))
    request.user = alice
    return {"request": request, **submission_context(alice)}


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_a_json_spec_is_checked_as_drf_checks_it(context, spec):
    assert _outcome(JobSubmitSerializer, spec, context) == _outcome(CheckedByDrf, spec, context)


@pytest.mark.parametrize("form", ["command=python&gpus=1&tenant=vision", "command=python&command=t.py&gpus=2",
                                  "gpus=1&tenant=vision", "command=python&gpus=1&shareable=on&tenant=vision",
                                  "command=python&gpus=1&env.A=1&tenant=vision", ""])
def test_a_form_is_checked_field_by_field_as_drf_checks_it(context, form):
    spec = QueryDict(form)
    assert _outcome(JobSubmitSerializer, spec, context) == _outcome(CheckedByDrf, spec, context)


def test_a_spec_that_leaves_a_field_out_is_checked_without_it(context):
    checked = JobSubmitSerializer(data={**OK, "tenant": "vision"}, context=context)
    assert checked.is_valid(), checked.errors
    assert "env" not in checked.validated_data and checked.validated_data["priority"] == 0
