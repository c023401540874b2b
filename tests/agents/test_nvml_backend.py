"""The NVML backend against a fake ``pynvml`` module (no GPU needed): inventory, every sampled
field and how each degrades, per-job memory through a real process tree, XIDs, topology, the probe."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from agents import nvml_probe, protocol
from agents.backends import nvml
from agents.backends.base import BackendUnavailable, GpuBackend, JobProcesses
from agents.runner import read_tail

from .fakenvml import (
    MIB,
    NVML_ERROR_GPU_IS_LOST,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_INTERNAL,
    NVML_TOPOLOGY_MULTIPLE,
    NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SINGLE,
    NVML_TOPOLOGY_SYSTEM,
    FakeGpu,
    FakeNVMLError,
    fake_pynvml,
)
from .helpers import launch, python, wait_for

TWO_GPUS = [
    FakeGpu(uuid="GPU-aaaa", name="NVIDIA A100-SXM4-80GB", total_bytes=81920 * MIB, bus_id="00000000:07:00.0"),
    FakeGpu(uuid=b"GPU-bbbb", name=b"NVIDIA A100-SXM4-80GB", total_bytes=81920 * MIB + 123, bus_id="00000000:0F:00.0"),
]


def backend_for(monkeypatch, gpus, **kwargs) -> nvml.NvmlBackend:
    fake = fake_pynvml(gpus, **kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return nvml.NvmlBackend("n1")


# ---------------------------------------------------------------- inventory


def test_inventory_reads_every_gpu(monkeypatch):
    fake = fake_pynvml(TWO_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = nvml.NvmlBackend("n1")
    assert isinstance(backend, GpuBackend)
    gpus = backend.inventory()
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920),
        (1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 81920),  # bytes from old pynvml decoded
    ]
    backend.close()
    backend.close()
    assert (fake.calls["init"], fake.calls["shutdown"]) == (1, 1)


def test_unreadable_name_and_uuid_degrade_instead_of_crashing(monkeypatch):
    gpus = backend_for(monkeypatch, TWO_GPUS, fail={("name", 1): 999, ("uuid", 1): 999}).inventory()
    assert gpus[0].model == "NVIDIA A100-SXM4-80GB"
    assert (gpus[1].model, gpus[1].uuid, gpus[1].memory_mib) == ("unknown", "GPU-unknown-n1-1", 81920)


def test_gpu_with_unreadable_memory_is_left_out(monkeypatch):
    gpus = backend_for(monkeypatch, TWO_GPUS, fail={("memory", 0): NVML_ERROR_GPU_IS_LOST}).inventory()
    assert [gpu.index for gpu in gpus] == [1]


def test_available_needs_init_and_at_least_one_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS))
    assert nvml.available() is True
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    assert nvml.available() is False
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TWO_GPUS, init_error=FakeNVMLError(9, "no driver")))
    assert nvml.available() is False


def test_missing_library_means_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert nvml.available() is False
    with pytest.raises(BackendUnavailable, match="pynvml is not installed"):
        nvml.NvmlBackend("n1")


def test_init_failure_is_reported_as_unavailable(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "pynvml", fake_pynvml(TWO_GPUS, init_error=FakeNVMLError(9, "Driver Not Loaded"))
    )
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        nvml.NvmlBackend("n1")


# ---------------------------------------------------------------- per-GPU readings


def test_sample_reads_every_field_in_wire_units(monkeypatch):
    gpu = FakeGpu(used_bytes=30000 * MIB + 5, power_mw=251_549, ecc_uncorrected=2)
    backend = backend_for(monkeypatch, [gpu])
    [reading] = backend.sample({}).gpus
    assert reading == protocol.GpuSample(
        index=0,
        util_sm=87,
        util_mem=41,
        mem_used_mib=30000,
        mem_total_mib=81920,
        temperature_c=63,
        power_w=251.5,  # mW -> W
        sm_clock_mhz=1410,
        mem_clock_mhz=1593,
        ecc_uncorrected=2,
        xid_events=[],
    )


def test_readings_out_of_any_real_range_are_unknown_and_the_sample_still_goes_out(monkeypatch):
    """A broken sensor (0xFFFFFFFF degrees, an absurd clock) must not cost the node its sample:
    the wire schema would refuse the whole message, so such a reading is "unknown" instead."""
    gpu = FakeGpu(temperature=0xFFFFFFFF, power_mw=2**40, ecc_uncorrected=5)
    backend = backend_for(monkeypatch, [gpu])
    [reading] = backend.sample({}).gpus
    assert (reading.temperature_c, reading.power_w, reading.ecc_uncorrected) == (None, None, 5)
    sample = protocol.NodeSample(node="n1", ts=1.0, seq=0, gpus=[reading])
    assert protocol.decode_sample(protocol.encode(sample)) == sample


def test_unsupported_fields_are_unknown_and_each_failure_is_logged_once(monkeypatch, caplog):
    backend = backend_for(
        monkeypatch,
        [FakeGpu(), FakeGpu(uuid="GPU-b")],
        fail={
            ("ecc", 1): 3,  # NOT_SUPPORTED, as on consumer boards
            ("power", 1): 3,
            ("temperature", 1): 3,
            ("clock", 1): 3,
            ("utilization", 0): NVML_ERROR_GPU_IS_LOST,
        },
    )
    caplog.set_level(logging.WARNING, logger="agents.backends.nvml")
    for _ in range(3):
        first, second = backend.sample({}).gpus
    assert first.util_sm is None and first.util_mem is None
    assert first.power_w == 251.5 and first.ecc_uncorrected == 0  # the other fields still read
    assert (second.ecc_uncorrected, second.power_w, second.temperature_c) == (None, None, None)
    assert (second.sm_clock_mhz, second.mem_clock_mhz) == (None, None)
    assert second.util_sm == 87 and second.mem_used_mib == 1024
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU 1: cannot read ECC errors: Not Supported" in m for m in messages) == 1
    assert sum("GPU 0: cannot read utilisation: GPU is lost" in m for m in messages) == 1
    assert len(messages) == 6  # one per distinct failure, not per sample


def test_every_call_failing_still_yields_a_valid_node_sample(monkeypatch):
    everything = [
        "utilization", "memory", "temperature", "power", "clock", "ecc", "compute", "graphics",
        "process_util", "event_set", "pci", "nvlink", "topology",
    ]
    backend = backend_for(monkeypatch, TWO_GPUS)
    backend.inventory()  # the inventory read fine; then the GPUs fell off the bus
    sys.modules["pynvml"].fail.update({(function, None): NVML_ERROR_GPU_IS_LOST for function in everything})
    reading = backend.sample({1: JobProcesses(job_id=1, pid=os.getpid())})
    sample = protocol.NodeSample(node="n1", ts=1.0, seq=0, gpus=reading.gpus, jobs=reading.jobs,
                                 unattributed_mib=reading.unattributed_mib)
    assert [g.index for g in sample.gpus] == [0, 1]
    assert all(value is None for g in sample.gpus for key, value in g if key not in ("index", "xid_events"))
    assert sample.jobs == [] and sample.unattributed_mib == {}
    assert {(link.a, link.b, link.kind) for link in backend.topology()} == {(0, 1, "unknown")}


# ---------------------------------------------------------------- per-process memory


# A job whose leader starts a child (same session and group) and one that escapes into its own
# session (only the process tree still ties it to the job), and reports both pids.
FAMILY = """
import subprocess, sys, time
sleep = [sys.executable, '-c', 'import time; time.sleep(60)']
child = subprocess.Popen(sleep)
escaped = subprocess.Popen(sleep, start_new_session=True)
print(child.pid, escaped.pid, flush=True)
time.sleep(60)
"""


def test_process_memory_is_attributed_to_the_job_through_its_process_tree(monkeypatch, runner):
    cmd = launch(python(FAMILY), gpus=[0])
    leader = runner.launch(cmd)
    output = runner.job_dir(cmd.job_id) / "output.log"
    # (the line may be read while the supervisor is still copying it: both numbers and its end)
    child, escaped = map(int, wait_for(lambda: (text := read_tail(output)).endswith("\n") and text.split()))
    assert os.getsid(escaped) == escaped != leader
    stranger = os.getpid()  # not launched by the agent
    vanished = 2**22 + 4321  # listed by NVML, gone by the time we look
    gpus = [
        FakeGpu(
            compute=[(leader, 600 * MIB), (child, 2000 * MIB), (escaped, 1000 * MIB), (stranger, 300 * MIB),
                     (vanished, 50 * MIB)],
            graphics=[(child, 2000 * MIB)],  # compute and graphics: listed twice, counted once
            process_util=[(leader, 100, 10), (child, 100, 25), (child, 200, 40), (stranger, 200, 7)],
        ),
        FakeGpu(uuid="GPU-b", compute=[(escaped, None), (stranger, None)]),  # memory hidden (WDDM)
    ]
    backend = backend_for(monkeypatch, gpus)
    reading = backend.sample(runner.processes())
    assert reading.jobs == [protocol.JobGpuSample(job_id=cmd.job_id, gpu_index=0, mem_used_mib=3600, util_sm=50)]
    assert reading.unattributed_mib == {0: 350, 1: 0}
    # Per-process utilisation is read incrementally: the next call asks for newer samples only.
    backend.sample(runner.processes())
    assert sys.modules["pynvml"].calls["util_since"][-2:] == [(0, 200), (1, 0)]


def test_jobs_are_matched_by_their_leader_pid(monkeypatch):
    gpu = FakeGpu(compute=[(os.getpid(), 4096 * MIB)])
    backend = backend_for(monkeypatch, [gpu], fail={("process_util", None): 3})
    reading = backend.sample({7: JobProcesses(job_id=7, pid=os.getpid(), gpu_indices=(0,))})
    # Per-process utilisation not supported: memory is known, utilisation unknown.
    assert reading.jobs == [protocol.JobGpuSample(job_id=7, gpu_index=0, mem_used_mib=4096, util_sm=None)]
    assert reading.unattributed_mib == {0: 0}


def test_unreadable_process_lists_leave_the_gpu_out_of_attribution(monkeypatch):
    gpus = [FakeGpu(compute=[(os.getpid(), MIB)]), FakeGpu(uuid="GPU-b", compute=[(os.getpid(), MIB)])]
    backend = backend_for(monkeypatch, gpus, fail={("compute", 1): 3, ("graphics", 1): 3})
    reading = backend.sample({})
    assert reading.unattributed_mib == {0: 1}  # GPU 1: unknown, not zero


# ---------------------------------------------------------------- XID events


def test_xid_events_are_drained_without_blocking_and_reported_once(monkeypatch):
    backend = backend_for(monkeypatch, [FakeGpu(), FakeGpu(uuid="GPU-b")], xids=[(0, 79), (1, 48), (0, 13)])
    first = backend.sample({})
    assert [g.xid_events for g in first.gpus] == [[79, 13], [48]]
    second = backend.sample({})
    assert [g.xid_events for g in second.gpus] == [[], []]
    fake = sys.modules["pynvml"]
    assert set(fake.calls["event_waits"]) == {0}  # timeout 0: never blocks the agent loop
    fake.events.append((1, 31))
    assert [g.xid_events for g in backend.sample({}).gpus] == [[], [31]]


def test_gpu_without_event_support_still_samples(monkeypatch, caplog):
    backend = backend_for(monkeypatch, [FakeGpu(), FakeGpu(uuid="GPU-b")], fail={("register_events", 0): 3},
                          xids=[(0, 79), (1, 48)])
    assert [g.xid_events for g in backend.sample({}).gpus] == [[], [48]]
    assert "GPU 0: cannot read XID events: Not Supported" in caplog.text


# ---------------------------------------------------------------- topology


def test_topology_maps_pcie_levels_and_counts_nvlinks(monkeypatch):
    buses = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0", "00000000:87:00.0"]
    gpus = [FakeGpu(uuid=f"GPU-{i}", bus_id=bus) for i, bus in enumerate(buses)]
    # GPUs 0 and 1 are bridged by two NVLinks (plus an inactive one); the legacy 4-digit domain
    # spelling of the remote bus id must still match.
    gpus[0].nvlinks = [(True, "0000:0f:00.0"), (True, buses[1]), (False, buses[2])]
    gpus[1].nvlinks = [(True, buses[0]), (True, buses[0])]
    levels = {
        (0, 2): NVML_TOPOLOGY_HOSTBRIDGE, (0, 3): NVML_TOPOLOGY_NODE, (0, 4): NVML_TOPOLOGY_SYSTEM,
        (1, 2): NVML_TOPOLOGY_SYSTEM, (1, 3): NVML_TOPOLOGY_SINGLE, (1, 4): NVML_TOPOLOGY_SYSTEM,
        (2, 3): NVML_TOPOLOGY_MULTIPLE, (2, 4): NVML_TOPOLOGY_INTERNAL, (3, 4): 77,
    }
    backend = backend_for(monkeypatch, gpus, topology=levels, fail={("topology", 1): 3})
    links = {(link.a, link.b): (link.kind, link.bandwidth_gbps) for link in backend.topology()}
    assert links == {
        (0, 1): ("nvlink", 400.0),
        (0, 2): ("pcie_host_bridge", None),
        (0, 3): ("pcie_host_bridge", None),
        (0, 4): ("system", None),
        (1, 2): ("unknown", None),  # the call failed for this pair
        (1, 3): ("unknown", None),
        (1, 4): ("unknown", None),
        (2, 3): ("pcie_switch", None),
        (2, 4): ("same_board", None),
        (3, 4): ("unknown", None),  # a level NVML added after us
    }
    assert backend.topology() == backend.topology()  # read once, cached


def test_gpus_on_nvswitch_are_all_nvlinked(monkeypatch):
    switch = "00000000:C1:00.0"
    gpus = [FakeGpu(uuid=f"GPU-{i}", bus_id=f"00000000:{16 + i:02X}:00.0", nvlinks=[(True, switch)] * links)
            for i, links in enumerate([12, 12, 6])]
    links = {(link.a, link.b): (link.kind, link.bandwidth_gbps) for link in backend_for(monkeypatch, gpus).topology()}
    assert links == {(0, 1): ("nvlink", 2400.0), (0, 2): ("nvlink", 1200.0), (1, 2): ("nvlink", 1200.0)}


# ---------------------------------------------------------------- the probe


def test_probe_prints_inventory_topology_and_a_sample_as_json(monkeypatch, capsys):
    gpu = FakeGpu(compute=[(os.getpid(), 2048 * MIB)])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([gpu, FakeGpu(uuid="GPU-b")]))
    assert nvml_probe.main(["--job-pid", str(os.getpid())]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [gpu["uuid"] for gpu in report["inventory"]] == ["GPU-aaaa", "GPU-b"]
    assert report["topology"] == [{"a": 0, "b": 1, "kind": "system", "bandwidth_gbps": None}]
    # no samples: idle
    assert report["sample"]["jobs"] == [{"job_id": 1, "gpu_index": 0, "mem_used_mib": 2048, "util_sm": 0.0}]
    assert report["sample"]["gpus"][0]["power_w"] == 251.5


def test_probe_without_nvml_exits_1(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml_probe.main([]) == 1
    assert "NVML unavailable" in capsys.readouterr().err
