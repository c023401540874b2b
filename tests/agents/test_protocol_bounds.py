"""Every number an agent sends is bounded: non-finite and absurd values are rejected at parse, with
a reason naming the field, before anything stores them (a signed message is still untrusted)."""

from __future__ import annotations

import copy
import json
import types
import typing

import pytest
from pydantic import BaseModel

from agents import protocol

# One valid message of each kind an agent sends, as the JSON object on the wire.
REGISTERED = {
    "v": 1, "kind": "node_registered", "node": "n1", "backend": "nvml", "agent_version": "0.1", "hostname": "h",
    # A MIG instance first (its numbers are the ones poisoned), then a whole GPU.
    "gpus": [{"index": 0, "uuid": "MIG-0", "model": "H100-80GB", "memory_mib": 9984, "isolation": "mig",
              "mig_profile": "1g.10gb", "parent_index": 0},
             {"index": 1, "uuid": "GPU-1", "model": "H100-80GB", "memory_mib": 81559, "isolation": "mps"}],
    "topology": [{"a": 0, "b": 1, "kind": "nvlink", "bandwidth_gbps": 900.0}],
    "running_jobs": [7], "cpu_milli": 64000, "host_memory_mib": 512 * 1024,
}
STARTED = {"v": 1, "kind": "job_started", "node": "n1", "job_id": 7, "pid": 4242, "started_at": 1_700_000_000.5}
EXITED = {"v": 1, "kind": "job_exited", "node": "n1", "job_id": 7, "exit_code": -9, "finished_at": 1_700_000_100.0}
SAMPLE = {
    "v": 1, "kind": "node_sample", "node": "n1", "ts": 1_700_000_000.0, "seq": 12,
    "gpus": [{"index": 0, "util_sm": 50.0, "util_mem": 20.0, "mem_used_mib": 1000, "mem_total_mib": 81559,
              "temperature_c": 60.0, "power_w": 300.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
              "ecc_uncorrected": 0, "xid_events": [79]}],
    "jobs": [{"job_id": 7, "gpu_index": 0, "mem_used_mib": 900, "util_sm": 45.0}],
    "unattributed_mib": {"0": 100},
    "running_jobs": [7],
    "duty_cycles": [0.5],
}

KEY = ("[key]",)  # a path ending in KEY puts the value in the place of that dict's (only) key
# (message, decoder, path to the number). Every numeric field of every agent -> control plane message.
FIELDS = [
    (REGISTERED, protocol.decode_event, ("gpus", 0, "index")),
    (REGISTERED, protocol.decode_event, ("gpus", 0, "memory_mib")),
    (REGISTERED, protocol.decode_event, ("gpus", 0, "parent_index")),
    (REGISTERED, protocol.decode_event, ("topology", 0, "a")),
    (REGISTERED, protocol.decode_event, ("topology", 0, "b")),
    (REGISTERED, protocol.decode_event, ("topology", 0, "bandwidth_gbps")),
    (REGISTERED, protocol.decode_event, ("running_jobs", 0)),
    (REGISTERED, protocol.decode_event, ("cpu_milli",)),
    (REGISTERED, protocol.decode_event, ("host_memory_mib",)),
    (STARTED, protocol.decode_event, ("job_id",)),
    (STARTED, protocol.decode_event, ("pid",)),
    (STARTED, protocol.decode_event, ("started_at",)),
    (EXITED, protocol.decode_event, ("job_id",)),
    (EXITED, protocol.decode_event, ("exit_code",)),
    (EXITED, protocol.decode_event, ("finished_at",)),
    (SAMPLE, protocol.decode_sample, ("ts",)),
    (SAMPLE, protocol.decode_sample, ("seq",)),
    *[(SAMPLE, protocol.decode_sample, ("gpus", 0, name)) for name in (
        "index", "util_sm", "util_mem", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w",
        "sm_clock_mhz", "mem_clock_mhz", "ecc_uncorrected")],
    (SAMPLE, protocol.decode_sample, ("gpus", 0, "xid_events", 0)),
    *[(SAMPLE, protocol.decode_sample, ("jobs", 0, name))
      for name in ("job_id", "gpu_index", "mem_used_mib", "util_sm")],
    (SAMPLE, protocol.decode_sample, ("unattributed_mib", "0")),
    (SAMPLE, protocol.decode_sample, ("unattributed_mib", *KEY)),
    (SAMPLE, protocol.decode_sample, ("running_jobs", 0)),
    (SAMPLE, protocol.decode_sample, ("duty_cycles", 0)),
]
# As written by hand into the JSON: non-finite literals (what Python's json module emits for
# inf/nan), a float far out of range, and integers too big for any column.
POISON = ["Infinity", "-Infinity", "NaN", "1e20", "-1e20", str(10**30), str(-(10**30))]
MARK = "@@POISON@@"


def _with_poison(message: dict, path: tuple, token: str) -> dict:
    """The stream fields of ``message`` with the number at ``path`` replaced by the JSON ``token``."""
    payload = copy.deepcopy(message)
    *parents, last = path
    node = payload
    for part in parents:
        node = node[part]
    if last == KEY[0]:
        node.clear()
        node[MARK] = 1
        text = json.dumps(payload).replace(json.dumps(MARK), json.dumps(token))  # keys are strings in JSON
    else:
        node[last] = MARK
        text = json.dumps(payload).replace(json.dumps(MARK), token)
    return {b"m": text.encode()}


def _field_name(path: tuple) -> str:
    return [part for part in path if isinstance(part, str) and part not in (KEY[0], "0")][-1]


@pytest.mark.parametrize("message, decode", [(REGISTERED, protocol.decode_event), (STARTED, protocol.decode_event),
                                             (EXITED, protocol.decode_event), (SAMPLE, protocol.decode_sample)],
                         ids=lambda value: value["kind"] if isinstance(value, dict) else "")
def test_the_valid_messages_parse(message, decode):
    # Otherwise a rejection below could be for some other reason than the poisoned number.
    assert decode({b"m": json.dumps(message).encode()}).kind == message["kind"]


@pytest.mark.parametrize("token", POISON)
@pytest.mark.parametrize("message, decode, path", FIELDS,
                         ids=[f"{message['kind']}.{'.'.join(map(str, path))}" for message, _, path in FIELDS])
def test_non_finite_and_out_of_range_numbers_are_rejected_with_the_field_named(message, decode, path, token):
    with pytest.raises(protocol.ProtocolError) as rejected:
        decode(_with_poison(message, path, token))
    assert _field_name(path) in rejected.value.reason


def _numeric_fields(model: type[BaseModel], prefix: tuple = ()) -> set[tuple]:
    """Paths of every int/float in ``model``, list items as 0 and dict keys as KEY."""
    found = set()
    for name, info in model.model_fields.items():
        found |= _numbers_in(info.annotation, prefix + (name,))
    return found


def _numbers_in(annotation, path: tuple) -> set[tuple]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _numbers_in(args[0], path)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_numbers_in(arg, path) for arg in args))
    if origin is list:
        return _numbers_in(args[0], path + (0,))
    if origin is dict:
        return _numbers_in(args[0], path + KEY) | _numbers_in(args[1], path + ("0",))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _numeric_fields(annotation, path)
    if annotation in (int, float):
        return {path}
    return set()


@pytest.mark.parametrize("model, message", [(protocol.NodeRegistered, REGISTERED), (protocol.JobStarted, STARTED),
                                            (protocol.JobExited, EXITED), (protocol.NodeSample, SAMPLE)],
                         ids=lambda value: value["kind"] if isinstance(value, dict) else "")
def test_every_numeric_field_of_every_agent_message_is_poison_tested(model, message):
    # A number added to a message later must be bounded and listed in FIELDS.
    tested = {path for tested_message, _, path in FIELDS if tested_message is message}
    assert _numeric_fields(model) - {("v",)} == tested


@pytest.mark.parametrize(
    "message, decode, path, fine, too_far",
    [
        (STARTED, protocol.decode_event, ("started_at",), protocol.UNIX_TIME_MAX, protocol.UNIX_TIME_MAX + 1),
        (STARTED, protocol.decode_event, ("started_at",), 0, -1),
        (STARTED, protocol.decode_event, ("pid",), protocol.PID_MAX, protocol.PID_MAX + 1),
        (EXITED, protocol.decode_event, ("exit_code",), 255, 256),
        (EXITED, protocol.decode_event, ("exit_code",), -255, -256),
        (EXITED, protocol.decode_event, ("job_id",), 2**63 - 1, 2**63),
        (REGISTERED, protocol.decode_event, ("gpus", 0, "memory_mib"), protocol.MEMORY_MIB_MAX,
         protocol.MEMORY_MIB_MAX + 1),
        (SAMPLE, protocol.decode_sample, ("gpus", 0, "temperature_c"), -40.0, -101.0),
        (SAMPLE, protocol.decode_sample, ("gpus", 0, "temperature_c"), 200.0, 201.0),
        (SAMPLE, protocol.decode_sample, ("seq",), 2**63 - 1, 2**63),
        (SAMPLE, protocol.decode_sample, ("jobs", 0, "mem_used_mib"), protocol.MEMORY_MIB_MAX,
         protocol.MEMORY_MIB_MAX + 1),
    ],
)
def test_bounds_take_the_extremes_a_real_node_sends_and_no_further(message, decode, path, fine, too_far):
    decode(_with_poison(message, path, json.dumps(fine)))
    with pytest.raises(protocol.ProtocolError, match=_field_name(path)):
        decode(_with_poison(message, path, json.dumps(too_far)))


def test_memory_bounds_fit_the_32_bit_columns_that_store_them():
    # Gpu.memory_mib, Job.peak_gpu_memory_mib, the rollups' mem_max: PositiveIntegerField/IntegerField.
    assert protocol.MEMORY_MIB_MAX <= 2**31 - 1


def test_the_reported_poison_messages_are_rejected():
    # From the issue: a signed sample at Infinity degrees stopped ingest; a start at 1e20 s stalled events.
    hot = _with_poison(SAMPLE, ("gpus", 0, "temperature_c"), "Infinity")
    with pytest.raises(protocol.ProtocolError, match=r"gpus\.0\.temperature_c: Input should be a finite number"):
        protocol.decode_sample({**hot, b"sig": b"00"})
    with pytest.raises(protocol.ProtocolError, match=r"started_at: Input should be less than or equal to"):
        protocol.decode_event(_with_poison(STARTED, ("started_at",), "1e20"))


def test_models_built_in_code_refuse_non_finite_numbers_too():
    # The agent builds messages from backend readings: a NaN reading fails there, not on the server.
    with pytest.raises(ValueError, match="finite"):
        protocol.GpuSample(index=0, power_w=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        protocol.GpuLink(a=0, b=1, kind="nvlink", bandwidth_gbps=float("inf"))
