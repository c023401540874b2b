"""The NVML backend on GPUs in MIG mode, against the fake ``pynvml``: each MIG device is a
schedulable device of its own (UUID, memory, profile, parent), sampled and attributed through its
own handle, with what NVML cannot split per instance reported as unknown."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from agents import protocol
from agents.backends import nvml
from agents.backends.base import JobProcesses

from .fakenvml import (
    MIB,
    NVML_ERROR_GPU_IS_LOST,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_SYSTEM,
    FakeGpu,
    FakeMig,
    fake_pynvml,
)

H100 = "NVIDIA H100 80GB HBM3"


def one_g(uuid: str, gi: int, **fields) -> FakeMig:
    return FakeMig(uuid=uuid, gpu_instance_id=gi, **fields)


def two_g(uuid: str, gi: int, **fields) -> FakeMig:
    fields = {"profile_name": "MIG 2g.20gb", "profile_id": 14, "profile_index": 1, "slices": 2,
              "profile_memory_mb": 19968, "total_bytes": 19968 * MIB, **fields}
    return FakeMig(uuid=uuid, gpu_instance_id=gi, **fields)


def three_g(uuid: str, gi: int, **fields) -> FakeMig:
    fields = {"profile_name": "MIG 3g.40gb", "profile_id": 9, "profile_index": 2, "slices": 3,
              "profile_memory_mb": 40192, "total_bytes": 40192 * MIB, **fields}
    return FakeMig(uuid=uuid, gpu_instance_id=gi, **fields)


def mig_gpu(*instances, **fields) -> FakeGpu:
    fields.setdefault("name", H100)
    return FakeGpu(uuid=fields.pop("uuid", "GPU-mig"), mig=list(instances), **fields)


def backend_for(monkeypatch, gpus, **kwargs) -> nvml.NvmlBackend:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus, **kwargs))
    return nvml.NvmlBackend("n1")


def devices(backend) -> list[tuple]:
    return [(g.index, g.uuid, g.model, g.memory_mib, g.isolation, g.mig_profile, g.parent_index)
            for g in backend.inventory()]


# ---------------------------------------------------------------- inventory


def test_a_mig_gpu_is_listed_as_its_instances_and_later_gpus_are_numbered_after_them(monkeypatch):
    gpus = [
        FakeGpu(uuid="GPU-whole-0", name=H100, bus_id="00000000:07:00.0"),
        # An empty slot between two instances, as after `nvidia-smi mig -dgi` of the middle one.
        mig_gpu(one_g("MIG-a", 7), None, two_g("MIG-b", 3), uuid="GPU-mig-1", bus_id="00000000:0F:00.0"),
        FakeGpu(uuid="GPU-whole-2", name=H100, bus_id="00000000:47:00.0"),
    ]
    backend = backend_for(monkeypatch, gpus)
    assert devices(backend) == [
        (0, "GPU-whole-0", H100, 81920, "unfenced", None, None),
        (1, "MIG-a", H100, 9728, "mig", "1g.10gb", 1),
        (2, "MIG-b", H100, 19968, "mig", "2g.20gb", 1),
        (3, "GPU-whole-2", H100, 81920, "unfenced", None, None),  # NVML's GPU 2, pushed up
    ]
    registered = protocol.NodeRegistered(node="n1", gpus=backend.inventory(), backend="nvml",
                                         agent_version="t", hostname="h", topology=backend.topology())
    assert protocol.decode_event(protocol.encode(registered)) == registered


@pytest.mark.parametrize(
    "instance, profile_names, fail, expected",
    [
        (three_g("MIG-c", 2), True, {}, "3g.40gb"),
        # A binding whose profile info has no name: built from its slices and memory.
        (three_g("MIG-c", 2), False, {}, "3g.40gb"),
        (one_g("MIG-c", 2, profile_name="MIG 1g.10gb+me", profile_id=20, profile_index=7), True, {}, "1g.10gb+me"),
        # A compute instance smaller than its GPU instance.
        (three_g("MIG-c", 2, compute_slices=1), True, {}, "1c.3g.40gb"),
        # GPU instance handles need a privileged user: the MIG device's own attributes still tell.
        (three_g("MIG-c", 2), True, {("gpu_instance", None): 4}, "3g.40gb"),
        # A name spelled in a way the wire schema does not take is rebuilt from the figures.
        (three_g("MIG-c", 2, profile_name="MIG 3g.40gb-me"), True, {}, "3g.40gb"),
    ],
)
def test_mig_profile_is_nvml_s_name_or_built_from_the_profile(monkeypatch, instance, profile_names, fail, expected):
    backend = backend_for(monkeypatch, [mig_gpu(instance)], profile_names=profile_names, fail=fail)
    [device] = backend.inventory()
    assert (device.uuid, device.mig_profile, device.parent_index) == ("MIG-c", expected, 0)


def test_a_mig_device_without_memory_uuid_or_profile_is_left_out_and_the_rest_keep_consecutive_numbers(
    monkeypatch, caplog
):
    gpu = mig_gpu(one_g("MIG-a", 1), one_g("MIG-b", 2), one_g("MIG-c", 3), one_g("MIG-d", 4))
    fail = {
        ("memory", (0, 0)): NVML_ERROR_GPU_IS_LOST,
        ("uuid", (0, 2)): 3,
        ("gpu_instance_id", (0, 3)): 3,
        ("attributes", (0, 3)): 3,
    }
    backend = backend_for(monkeypatch, [gpu], fail=fail)
    assert [(g.index, g.uuid) for g in backend.inventory()] == [(0, "MIG-b")]
    assert "GPU 0: MIG device 0 left out of the inventory: cannot read its memory" in caplog.text
    assert "MIG device 2 left out of the inventory: memory 9728 MiB, UUID ''" in caplog.text
    assert "profile None" in caplog.text


def test_a_gpu_in_mig_mode_without_instances_offers_nothing_and_says_so_once(monkeypatch, caplog):
    backend = backend_for(monkeypatch, [mig_gpu(), FakeGpu(uuid="GPU-whole")])
    for _ in range(3):
        assert [(g.index, g.uuid) for g in backend.inventory()] == [(1, "GPU-whole")]
    assert caplog.text.count("GPU 0 is in MIG mode but has no MIG device") == 1


def test_gpus_without_mig_support_are_whole_gpus_without_a_warning(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="agents.backends.nvml")
    # NOT_SUPPORTED (a V100, a consumer board) and FUNCTION_NOT_FOUND (a driver from before MIG).
    backend = backend_for(monkeypatch, [FakeGpu(), FakeGpu(uuid="GPU-b")],
                          fail={("mig_mode", 0): 3, ("mig_mode", 1): 13})
    assert [(g.index, g.isolation, g.mig_profile) for g in backend.inventory()] == [(0, "unfenced", None),
                                                                                    (1, "unfenced", None)]
    assert "MIG" not in caplog.text


def test_a_pynvml_from_before_mig_lists_whole_gpus(monkeypatch):
    fake = fake_pynvml([FakeGpu()])
    del fake.nvmlDeviceGetMigMode
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert [g.uuid for g in nvml.NvmlBackend("n1").inventory()] == ["GPU-aaaa"]


# ---------------------------------------------------------------- sampling


def test_each_instance_reports_its_own_memory_and_processes_and_unknown_utilisation(monkeypatch, caplog):
    job_pid, stranger = os.getpid(), 2**22 + 77
    gpus = [
        mig_gpu(
            one_g("MIG-a", 7, used_bytes=3000 * MIB, compute=[(job_pid, 2900 * MIB)]),
            two_g("MIG-b", 3, used_bytes=500 * MIB, compute=[(stranger, 400 * MIB)]),
            temperature=55, sm_clock=1980, mem_clock=2619, ecc_uncorrected=1,
        ),
        FakeGpu(uuid="GPU-whole", used_bytes=2048 * MIB, process_util=[(job_pid, 100, 30)],
                compute=[(job_pid, 2048 * MIB)]),
    ]
    backend = backend_for(monkeypatch, gpus)
    caplog.set_level(logging.WARNING, logger="agents.backends.nvml")
    reading = backend.sample({7: JobProcesses(job_id=7, pid=job_pid, gpu_indices=(0, 2))})
    first, second, whole = reading.gpus
    assert first == protocol.GpuSample(
        index=0, util_sm=None, util_mem=None, mem_used_mib=3000, mem_total_mib=9728, temperature_c=55,
        power_w=None, sm_clock_mhz=1980, mem_clock_mhz=2619, ecc_uncorrected=1, xid_events=[],
    )
    assert (second.mem_used_mib, second.mem_total_mib, second.temperature_c) == (500, 19968, 55)
    assert (whole.util_sm, whole.power_w, whole.mem_used_mib) == (87, 251.5, 2048)
    assert reading.jobs == [
        protocol.JobGpuSample(job_id=7, gpu_index=0, mem_used_mib=2900, util_sm=None),  # unknown, not idle
        protocol.JobGpuSample(job_id=7, gpu_index=2, mem_used_mib=2048, util_sm=30),
    ]
    assert reading.unattributed_mib == {0: 0, 1: 400, 2: 0}
    # Nothing was asked of a MIG device that NVML only answers per GPU, so nothing was logged.
    asked = {function for function, _handle in sys.modules["pynvml"].calls["mig_reads"]}
    assert asked <= {"uuid", "memory", "compute", "attributes", "gpu_instance_id"}
    assert caplog.text == ""


def test_instance_failures_degrade_to_unknown_and_the_sample_still_goes_out(monkeypatch):
    gpus = [mig_gpu(one_g("MIG-a", 7, compute=[(os.getpid(), MIB)]), two_g("MIG-b", 3))]
    backend = backend_for(monkeypatch, gpus)
    backend.inventory()
    sys.modules["pynvml"].fail.update({("memory", (0, 0)): NVML_ERROR_GPU_IS_LOST, ("compute", (0, 0)): 3,
                                       ("temperature", 0): 3})
    reading = backend.sample({})
    assert [(g.mem_total_mib, g.temperature_c) for g in reading.gpus] == [(None, None), (19968, None)]
    assert reading.unattributed_mib == {1: 0}  # instance 0: unknown, not zero
    sample = protocol.NodeSample(node="n1", ts=1.0, seq=0, gpus=reading.gpus, unattributed_mib=reading.unattributed_mib)
    assert protocol.decode_sample(protocol.encode(sample)) == sample


def test_an_xid_on_a_mig_gpu_is_reported_on_each_of_its_instances(monkeypatch):
    gpus = [mig_gpu(one_g("MIG-a", 7), two_g("MIG-b", 3)), FakeGpu(uuid="GPU-whole")]
    backend = backend_for(monkeypatch, gpus, xids=[(0, 94), (1, 79)])
    assert [g.xid_events for g in backend.sample({}).gpus] == [[94], [94], [79]]
    assert sys.modules["pynvml"].calls["registered"] == [0, 1]  # each GPU once, not per instance


# ---------------------------------------------------------------- topology


def test_instances_of_one_gpu_share_a_board_and_mig_gpus_have_no_nvlink(monkeypatch):
    buses = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0"]
    gpus = [
        mig_gpu(one_g("MIG-a", 7), two_g("MIG-b", 3), bus_id=buses[0], nvlinks=[(True, buses[1])]),
        FakeGpu(uuid="GPU-1", bus_id=buses[1], nvlinks=[(True, buses[0]), (True, buses[2])]),
        FakeGpu(uuid="GPU-2", bus_id=buses[2], nvlinks=[(True, buses[1])]),
    ]
    levels = {(0, 1): NVML_TOPOLOGY_HOSTBRIDGE, (0, 2): NVML_TOPOLOGY_SYSTEM}
    backend = backend_for(monkeypatch, gpus, topology=levels)
    links = {(link.a, link.b): (link.kind, link.bandwidth_gbps) for link in backend.topology()}
    assert links == {
        (0, 1): ("same_board", None),
        (0, 2): ("pcie_host_bridge", None),  # NVLinked to GPU 1, but MIG turns peer-to-peer off
        (0, 3): ("system", None),
        (1, 2): ("pcie_host_bridge", None),
        (1, 3): ("system", None),
        (2, 3): ("nvlink", 200.0),  # whole GPUs keep theirs; the link into the MIG GPU is not a switch
    }


def test_an_unprivileged_agent_still_names_profiles_and_warns_once_per_gpu(monkeypatch, caplog):
    gpu = mig_gpu(*(one_g(f"MIG-{slot}", slot + 1) for slot in range(7)))
    backend = backend_for(monkeypatch, [gpu], fail={("gpu_instance", None): 4})  # NO_PERMISSION
    assert {g.mig_profile for g in backend.inventory()} == {"1g.10gb"}
    assert caplog.text.count("cannot read MIG GPU instance profiles") == 1
