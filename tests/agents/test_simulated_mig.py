"""Simulated MIG: the ``[mig=...]`` spec, the instances it yields, and each instance read and
fenced on its own (a job overflowing one instance runs out of memory; its neighbours never see it)."""

from __future__ import annotations

import pytest

from agents import protocol
from agents.backends.base import JobProcesses
from agents.backends.simulated import SimulatedBackend, parse_gpus, parse_spec


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def job(job_id: int, workload: str, gpus=(0,), limit=None) -> JobProcesses:
    return JobProcesses(job_id=job_id, pid=10_000 + job_id, gpu_indices=tuple(gpus),
                        env={"COLONY_SIM_WORKLOAD": workload}, gpu_memory_limit_mib=limit)


def run(backend, clock, jobs, samples: int, step: float = 0.5):
    out = []
    for _ in range(samples):
        clock.now += step
        out.append(backend.sample({j.job_id: j for j in jobs}))
    return out


# ---------------------------------------------------------------- the spec and the inventory


def test_a_mig_group_lists_each_gpu_s_instances_then_the_next_gpus():
    backend = SimulatedBackend("2xA100-80GB[mig=3x1g.10gb,2g.20gb],1xA100-80GB", "n1")
    devices = [(g.index, g.uuid, g.memory_mib, g.isolation, g.mig_profile, g.parent_index) for g in backend.inventory()]
    assert devices == [
        (0, "MIG-sim-n1-0-0", 9728, "mig", "1g.10gb", 0),
        (1, "MIG-sim-n1-0-1", 9728, "mig", "1g.10gb", 0),
        (2, "MIG-sim-n1-0-2", 9728, "mig", "1g.10gb", 0),
        (3, "MIG-sim-n1-0-3", 19968, "mig", "2g.20gb", 0),
        (4, "MIG-sim-n1-1-0", 9728, "mig", "1g.10gb", 1),
        (5, "MIG-sim-n1-1-1", 9728, "mig", "1g.10gb", 1),
        (6, "MIG-sim-n1-1-2", 9728, "mig", "1g.10gb", 1),
        (7, "MIG-sim-n1-1-3", 19968, "mig", "2g.20gb", 1),
        (8, "GPU-sim-n1-2", 81920, "memory_limit", None, None),
    ]
    assert {g.model for g in backend.inventory()} == {"A100-80GB"}
    registered = protocol.NodeRegistered(node="n1", gpus=backend.inventory(), topology=backend.topology(),
                                         backend="simulated", agent_version="t", hostname="h")
    assert protocol.decode_event(protocol.encode(registered)) == registered


def test_whole_simulated_gpus_say_their_memory_is_enforced():
    backend = SimulatedBackend("2xT4-16GB", "n1")
    assert SimulatedBackend.native_isolation == "memory_limit"
    assert {g.isolation for g in backend.inventory()} == {"memory_limit"}


@pytest.mark.parametrize(
    "spec, layout",
    [
        (" 1 x h100-80gb [ MIG = 7x1G.10GB ] ", ("1g.10gb",) * 7),
        ("1xA100-40GB[mig=1g.5gb+me,2x1g.5gb,2g.10gb]", ("1g.5gb+me", "1g.5gb", "1g.5gb", "2g.10gb")),
        ("1xH100-80GB[mig=4g.40gb,3g.40gb]", ("4g.40gb", "3g.40gb")),
        ("1xA100-80GB[mig=7g.80gb]", ("7g.80gb",)),
    ],
)
def test_layouts_as_nvidia_smi_names_them(spec, layout):
    [gpu] = parse_gpus(spec)
    assert gpu.mig == layout
    assert parse_spec(spec) == [(gpu.model, gpu.memory_mib)]  # the physical GPU, however split


@pytest.mark.parametrize(
    "spec, message",
    [
        ("1xT4-16GB[mig=1g.5gb]", "T4-16GB does not support MIG; MIG models: A100-40GB, A100-80GB, H100-80GB"),
        ("1xA100-80GB[mig=1g.5gb]", "unknown MIG profile '1g.5gb' for A100-80GB; its profiles: 1g.10gb"),
        ("1xA100-80GB[mig=]", "empty MIG layout for A100-80GB"),
        ("1xA100-80GB[mig=0x1g.10gb]", "at least one instance"),
        ("1xA100-80GB[mig=3x3g.40gb]", "does not fit one A100-80GB: it needs 9 of 7 compute slices and 12 of 8"),
        ("1xH100-80GB[mig=3g.40gb,3g.40gb,1g.10gb]", "needs 7 of 7 compute slices and 9 of 8 memory slices"),
        ("1xA100-80GB[mig=2x1g.10gb+me]", r"at most one instance per GPU has the media engines \(\+me\)"),
        ("10xA100-80GB[mig=7x1g.10gb]", "more than 64 GPUs"),
        ("1xA100-80GB[mig=1g.10gb", "bad GPU group"),
        ("1xA100-80GB[mps=50]", "expected COUNTxMODEL or COUNTxMODEL\\[mig=LAYOUT\\]"),
    ],
)
def test_a_bad_mig_spec_is_refused_with_a_helpful_message(spec, message):
    with pytest.raises(ValueError, match=message):
        SimulatedBackend(spec, "n1")


# ---------------------------------------------------------------- readings and memory, per instance


def test_an_instance_that_overflows_kills_its_own_job_and_no_other():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB[mig=2x1g.10gb,3g.40gb]", "n1", clock=clock)  # 9728 MiB each 1g
    resident = job(1, "idle:mem=6000,ramp=0", gpus=(0,))
    neighbour = job(2, "idle:mem=6000,ramp=0", gpus=(1,))  # same GPU, other instance: fenced off
    grower = job(3, "mem=6000,ramp=2", gpus=(0,))
    run(backend, clock, [resident, neighbour], 1)
    samples = run(backend, clock, [resident, neighbour, grower], 8)
    [oom] = [o for s in samples for o in s.out_of_memory]
    assert (oom.job_id, oom.gpu_index) == (3, 0)
    assert oom.error.startswith("CUDA out of memory (simulated) on MIG instance 0 (1g.10gb on GPU 0): job 3 needs ")
    assert "the instance has 9728 MiB of which 6000 MiB are held by other jobs" in oom.error
    last = samples[-1]
    assert sorted((j.job_id, j.gpu_index, j.mem_used_mib) for j in last.jobs) == [(1, 0, 6000), (2, 1, 6000)]
    assert [g.mem_used_mib for g in last.gpus] == [6000, 6000, 0]


def test_a_job_over_its_limit_on_an_instance_runs_out_of_memory():
    clock = Clock()
    backend = SimulatedBackend("1xH100-80GB[mig=3g.40gb,4g.40gb]", "n1", clock=clock)
    [sample] = run(backend, clock, [job(1, "idle:mem=30000,ramp=0", gpus=(1,), limit=20000)], 1)
    assert [o.job_id for o in sample.out_of_memory] == [1]
    assert "on MIG instance 1 (4g.40gb on GPU 0): job 1 needs 30000 MiB, over its limit of 20000 MiB" in \
        sample.out_of_memory[0].error


def test_each_instance_reports_its_own_load_and_shares_its_board_s_temperature():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB[mig=4g.40gb,3g.40gb],1xA100-80GB", "n1", clock=clock)
    busy = job(1, "train:mem=8000,util=90,ramp=0", gpus=(0,))
    sample = run(backend, clock, [busy], 4)[-1]
    first, second, whole = sample.gpus
    assert first.util_sm > 80 and second.util_sm == 0 and whole.util_sm == 0
    assert first.mem_total_mib == 40192 and first.mem_used_mib > 5000 and second.mem_used_mib == 0
    assert first.temperature_c == pytest.approx(second.temperature_c, abs=1.0)
    assert first.temperature_c > whole.temperature_c + 10
    assert first.sm_clock_mhz == second.sm_clock_mhz == 1410
    # Power is each instance's share of the board's, so the board's instances add up to one board.
    assert first.power_w > second.power_w and first.power_w + second.power_w < 400
    message = protocol.NodeSample(node="n1", ts=1.0, seq=0, gpus=sample.gpus, jobs=sample.jobs)
    assert protocol.decode_sample(protocol.encode(message)) == message


def test_an_xid_on_a_mig_gpu_shows_on_each_of_its_instances():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB[mig=2x3g.40gb],1xA100-80GB", "n1", clock=clock)
    backend.inject_xid(1, 94)
    backend.inject_xid(2, 79)
    assert [g.xid_events for g in run(backend, clock, [], 1)[0].gpus] == [[94], [94], [79]]


def test_instances_share_a_board_and_a_mig_gpu_has_no_nvlink():
    backend = SimulatedBackend("1xH100-80GB[mig=2x3g.40gb],3xH100-80GB", "n1")
    links = {(link.a, link.b): (link.kind, link.bandwidth_gbps) for link in backend.topology()}
    assert links[(0, 1)] == ("same_board", None)
    assert links[(0, 2)] == ("pcie_switch", None)  # boards 0 and 1 share a PCIe switch, no NVLink
    assert links[(1, 3)] == ("pcie_host_bridge", None)
    assert links[(2, 3)] == links[(3, 4)] == ("nvlink", 3600.0)  # whole H100s keep NVSwitch
