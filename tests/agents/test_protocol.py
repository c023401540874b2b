"""The wire schema: what round-trips, and what is rejected with which reason."""

from __future__ import annotations

import json

import pytest

from agents import protocol

GPU = protocol.GpuInfo(index=0, uuid="GPU-abc", model="A100-80GB", memory_mib=81920)

EVENTS = [
    protocol.NodeRegistered(node="n1", gpus=[GPU], backend="simulated", agent_version="0.1.0", hostname="h"),
    protocol.NodeRegistered(
        node="n1", gpus=[GPU, GPU.model_copy(update={"index": 1, "uuid": "GPU-def"})], backend="nvml",
        agent_version="0.2.0", hostname="h", running_jobs=[7, 9],
        topology=[protocol.GpuLink(a=0, b=1, kind="nvlink", bandwidth_gbps=2400.0)],
    ),
    protocol.JobStarted(node="n1", job_id=7, pid=1234, started_at=1700000000.5),
    protocol.JobExited(node="n1", job_id=7, exit_code=-9, stopped=True, output_tail="bye\n", finished_at=1.0),
    protocol.JobExited(node="n1", job_id=7, exit_code=None, error="no such file", finished_at=1.0),
    protocol.JobExited(node="n1", job_id=7, exit_code=-9, oom=True, error="CUDA out of memory", finished_at=1.0),
]
COMMANDS = [
    protocol.LaunchJob(command_id="c1", job_id=7, argv=["python", "train.py"], gpu_indices=[0, 1], env={"A": "b"}),
    protocol.StopJob(command_id="c2", job_id=7, grace_seconds=2.5),
    protocol.LaunchJob(command_id="c3", job_id=8, argv=["x"], gpu_indices=[0], gpu_memory_limit_mib=20000,
                       duty_cycle=0.5),
    protocol.SetDutyCycle(command_id="c4", job_id=8, duty_cycle=0.3),
    protocol.SuspendJob(command_id="c5", job_id=8),
    protocol.ResumeJob(command_id="c6", job_id=8),
]


def _launch_payload(**changes) -> dict:
    payload = {"v": 1, "kind": "launch", "command_id": "c1", "job_id": 7, "argv": ["true"], "gpu_indices": []}
    payload.update(changes)
    return {"m": json.dumps(payload)}


@pytest.mark.parametrize("message", EVENTS, ids=lambda m: m.kind)
def test_event_round_trips(message):
    fields = protocol.encode(message)
    assert protocol.decode_event(fields) == message
    # What redis-py hands back without decode_responses: bytes keys and values.
    assert protocol.decode_event({b"m": fields["m"].encode()}) == message


@pytest.mark.parametrize("message", COMMANDS, ids=lambda m: m.kind)
def test_command_round_trips(message):
    fields = protocol.encode(message)
    assert protocol.decode_command(fields) == message
    assert protocol.decode_command({b"m": fields["m"].encode()}) == message


@pytest.mark.parametrize(
    "fields, reason_contains",
    [
        (_launch_payload(v=2), "v"),
        ({"m": json.dumps({"v": 1, "kind": "launch", "command_id": "c1", "argv": ["true"], "gpu_indices": []})},
         "job_id: Field required"),
        (_launch_payload(kind="reboot"), "'reboot'"),
        (_launch_payload(shell=True), "shell: Extra inputs are not permitted"),
        (_launch_payload(argv=[]), "argv"),
        (_launch_payload(job_id=0), "job_id"),
        (_launch_payload(gpu_memory_limit_mib=2**44), "gpu_memory_limit_mib"),
        ({"m": b"\xff\xfe{}"}, "not UTF-8"),
        ({"m": "x" * (protocol.MAX_MESSAGE_BYTES + 1)}, "exceeds"),
        ({"m": "{not json"}, "Invalid JSON"),
        ({}, "missing field 'm'"),
        ({"m": "{}", "extra": "1"}, "unexpected stream fields: extra"),
    ],
    ids=["wrong-version", "missing-field", "unknown-kind", "extra-field", "empty-argv", "job-id-zero",
         "memory-limit-that-would-wrap", "non-utf8", "oversized", "bad-json", "no-payload", "extra-stream-field"],
)
def test_bad_command_is_rejected_with_a_reason(fields, reason_contains):
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.decode_command(fields)
    assert reason_contains in caught.value.reason


def test_command_is_not_accepted_as_an_event():
    with pytest.raises(protocol.ProtocolError, match="does not match any of the expected tags"):
        protocol.decode_event(protocol.encode(COMMANDS[0]))


def test_event_with_bad_node_name_is_rejected():
    fields = {"m": json.dumps({"v": 1, "kind": "job_started", "node": "a/b", "job_id": 1, "pid": 1, "started_at": 0})}
    with pytest.raises(protocol.ProtocolError, match="node"):
        protocol.decode_event(fields)


def test_node_sample_round_trips_with_unknown_readings():
    sample = protocol.NodeSample(
        node="n1", ts=1700000000.25, seq=41,
        gpus=[protocol.GpuSample(index=0, util_sm=87.5, mem_used_mib=30000, mem_total_mib=81920, xid_events=[79]),
              protocol.GpuSample(index=1)],  # nothing readable: every field unknown
        jobs=[protocol.JobGpuSample(job_id=7, gpu_index=0, mem_used_mib=29000, util_sm=None)],
        unattributed_mib={0: 1000}, running_jobs=[7],
    )
    fields = protocol.encode(sample)
    assert protocol.decode_sample(fields) == sample
    assert protocol.decode_sample({b"m": fields["m"].encode()}).gpus[1].power_w is None
