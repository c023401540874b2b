"""The bulk builder of frozen dataclasses makes what their constructor makes."""

import dataclasses
import pickle

import pytest

from jobs.scheduling.frozen_builder import builder
from jobs.scheduling.snapshot import JobClass, JobRequest, RecordedProfile, RunningJob


def test_a_built_request_is_the_constructors_in_every_respect():
    arguments = dict(id=7, tenant="vision", gpus=2, submitted_at=12.5, gpu_memory_mib=30_000,
                     gpu_models=frozenset({"A100"}),
                     profile=RecordedProfile(peak_memory_mib=9000, mean_utilisation=0.4),
                     waiting_for=((3, "ok"),), user="11")
    made, built = JobRequest(**arguments), builder(JobRequest)(**arguments)

    assert type(built) is JobRequest and isinstance(built, JobRequest)
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    assert built.priority == 0 and built.accepts_unfenced is True  # (the defaults)
    assert pickle.loads(pickle.dumps(built)) == made
    assert dataclasses.replace(built, gpus=3) == dataclasses.replace(made, gpus=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.gpus = 1  # type: ignore[misc]
    assert built != dataclasses.replace(made, tenant="speech")


def test_positional_arguments_and_other_classes():
    running = builder(RunningJob)(5, "nlp", JobClass.GUARANTEED, (1, 2), 100.0)
    assert running == RunningJob(5, "nlp", JobClass.GUARANTEED, (1, 2), 100.0)
    with pytest.raises(TypeError):
        builder(JobRequest)(1, "t")  # (what the constructor would refuse too: gpus and submitted_at missing)


def test_classes_it_cannot_build_faithfully_are_refused():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self):
            if self.x < 0:
                raise ValueError(self.x)

    @dataclasses.dataclass(frozen=True, slots=True, init=False)
    class OwnInit:
        x: int

        def __init__(self, x):
            object.__setattr__(self, "x", abs(x))

    for cls in (NoSlots, NotFrozen, Checked, OwnInit, int):
        with pytest.raises(TypeError):
            builder(cls)
