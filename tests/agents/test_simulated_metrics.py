"""Simulated GPU readings: workload profiles, co-located jobs adding up, duty cycles, OOM of the job
that overflowed, topology, determinism. Driven by a fake clock; no processes, no Redis."""

from __future__ import annotations

import pytest

from agents import protocol
from agents.backends.base import JobProcesses
from agents.backends.simulated import SimulatedBackend
from agents.backends.workloads import CONTEXT_MIB, DEFAULT_PEAK_MIB, Workload, parse_workload


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def job(job_id: int, workload: str | None = None, gpus=(0,), limit=None, duty=1.0) -> JobProcesses:
    env = {"COLONY_SIM_WORKLOAD": workload} if workload is not None else {}
    return JobProcesses(job_id=job_id, pid=10_000 + job_id, gpu_indices=tuple(gpus), env=env,
                        gpu_memory_limit_mib=limit, duty_cycle=duty)


def run(backend, clock, jobs, seconds: float, step: float = 0.5):
    """Sample every ``step`` seconds for ``seconds``; return the samples.

    A job's progress starts at the first sample that lists it (the agent samples right after a
    launch), so a job new to ``run`` is at t = 0 in the first sample, t = step in the second ...
    """
    samples = []
    for _ in range(int(round(seconds / step))):
        clock.now += step
        samples.append(backend.sample({j.job_id: j for j in jobs}))
    return samples


def job_memory(sample, job_id, gpu=0):
    return next((j.mem_used_mib for j in sample.jobs if j.job_id == job_id and j.gpu_index == gpu), None)


# ---------------------------------------------------------------- the spec language


@pytest.mark.parametrize(
    "spec, limit, expected",
    [
        (None, None, Workload("train", DEFAULT_PEAK_MIB, 90.0, 3.0, 10.0)),
        ("", 20000, Workload("train", 18000, 90.0, 3.0, 10.0)),  # 90% of the memory limit
        ("inference", None, Workload("inference", DEFAULT_PEAK_MIB, 20.0, 1.0, 3.0)),
        (" IDLE ", None, Workload("idle", DEFAULT_PEAK_MIB, 0.0, 1.0, 2.0)),
        ("mem=20000,util=60,period=5", None, Workload("train", 20000, 60.0, 5.0, 10.0)),
        ("inference:mem=12000, ramp=0", 30000, Workload("inference", 12000, 20.0, 1.0, 0.0)),
    ],
)
def test_workload_spec(spec, limit, expected):
    assert parse_workload(spec, limit) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("trian", "unknown workload 'trian'"),
        ("mem=lots", "mem: not a number"),
        ("mem=0", "mem must be a positive"),
        ("util=120", "util must be a percentage"),
        ("period=0", "period must be positive"),
        ("train:speed=3", "unknown key 'speed'"),
        ("train:mem", "expected key=value"),
    ],
)
def test_bad_workload_spec_says_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_workload(spec)


def test_bad_workload_falls_back_to_the_default(caplog):
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB", "n1", clock=clock)
    [_, sample] = run(backend, clock, [job(1, "mem=lots")], 60, step=30)
    assert 0.7 * DEFAULT_PEAK_MIB <= job_memory(sample, 1) <= DEFAULT_PEAK_MIB
    assert "bad COLONY_SIM_WORKLOAD='mem=lots'" in caplog.text


# ---------------------------------------------------------------- profiles


def test_training_ramps_up_then_saws_between_70_and_100_percent_of_its_peak():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB", "n1", clock=clock)
    train = job(1, "mem=20000,period=4")  # ramp 10 s
    samples = run(backend, clock, [train], 30, step=0.5)
    memory = [job_memory(s, 1) for s in samples]
    util = [s.gpus[0].util_sm for s in samples]
    ramp, steady = memory[:20], memory[20:]  # t = 0 .. 9.5 s, then 10 .. 29.5 s
    assert ramp == sorted(ramp) and CONTEXT_MIB == ramp[0] < ramp[-1] < 14000
    assert util[:20] == sorted(util[:20]) and util[0] < 20  # warming up
    assert min(steady) == 14000 and 19000 <= max(steady) < 20000
    drops = [i for i in range(1, len(steady)) if steady[i] < steady[i - 1]]
    assert len(drops) == 4  # a new iteration at 14, 18, 22 and 26 s: a sawtooth, not noise
    assert all(85 <= u <= 95 for u in util[20:])
    assert samples[-1].gpus[0].mem_used_mib == memory[-1]
    assert samples[-1].gpus[0].mem_total_mib == 81920


def test_inference_holds_flat_memory_and_bursts():
    clock = Clock()
    backend = SimulatedBackend("1xL4-24GB", "n1", clock=clock)
    samples = run(backend, clock, [job(1, "inference:mem=6000")], 120, step=1)
    steady = samples[5:]
    assert {job_memory(s, 1) for s in steady} == {6000}
    util = [s.gpus[0].util_sm for s in steady]
    bursts = [u for u in util if u > 40]
    assert 0.15 < len(bursts) / len(util) < 0.45
    assert 10 < sum(util) / len(util) < 30  # averages near its target of 20%


def test_idle_job_holds_memory_at_zero_utilisation():
    clock = Clock()
    backend = SimulatedBackend("1xT4-16GB", "n1", clock=clock)
    samples = run(backend, clock, [job(1, "idle:mem=9000")], 10, step=1)
    assert job_memory(samples[-1], 1) == 9000
    assert {s.gpus[0].util_sm for s in samples} == {0.0}
    assert samples[-1].gpus[0].sm_clock_mhz < 500  # an idle GPU clocks down


def test_co_located_jobs_add_up_and_utilisation_caps_at_100():
    clock = Clock()
    backend = SimulatedBackend("2xA100-80GB", "n1", clock=clock)
    jobs = [job(1, "idle:mem=10000,ramp=0"), job(2, "mem=20000,util=70,ramp=0"), job(3, "mem=5000,util=60,ramp=0"),
            job(4, "idle:mem=3000,ramp=0", gpus=(1,))]
    [sample] = run(backend, clock, jobs, 1, step=1)
    gpu0, gpu1 = sample.gpus
    on_gpu0 = [j for j in sample.jobs if j.gpu_index == 0]
    assert gpu0.mem_used_mib == sum(j.mem_used_mib for j in on_gpu0) == 10000 + 14000 + 3500
    assert gpu0.util_sm == 100.0  # 70 + 60, capped
    assert sum(j.util_sm for j in on_gpu0) > 100  # each job's own share is still reported
    assert (gpu1.mem_used_mib, gpu1.util_sm) == (3000, 0.0)
    assert sample.unattributed_mib == {}


def test_multi_gpu_job_uses_its_profile_on_each_gpu():
    clock = Clock()
    backend = SimulatedBackend("4xH100-80GB", "n1", clock=clock)
    [sample] = run(backend, clock, [job(1, "idle:mem=30000,ramp=0", gpus=(1, 3))], 1, step=1)
    assert [g.mem_used_mib for g in sample.gpus] == [0, 30000, 0, 30000]
    assert [(j.job_id, j.gpu_index) for j in sample.jobs] == [(1, 1), (1, 3)]


def test_duty_cycle_scales_utilisation_and_slows_the_iterations():
    clock = Clock()
    backend = SimulatedBackend("2xA100-80GB", "n1", clock=clock)
    full = job(1, "mem=20000,util=80,ramp=0,period=10")
    third = job(2, "mem=20000,util=80,ramp=0,period=10", gpus=(1,), duty=1 / 3)
    [*_, sample] = run(backend, clock, [full, third], 6, step=1)
    util = {j.job_id: j.util_sm for j in sample.jobs}
    assert 75 <= util[1] <= 85 and 25 <= util[2] <= 29
    # 5 s of wall time are 5 s of work for job 1 but 5/3 s for job 2: it is earlier in its iteration.
    assert job_memory(sample, 1) == 14000 + 6000 * 5 // 10
    assert job_memory(sample, 2, gpu=1) == 14000 + 6000 * 5 // 30


def test_suspended_job_keeps_its_memory_and_stands_still():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB", "n1", clock=clock)
    [*_, before] = run(backend, clock, [job(1, "mem=20000,period=10,ramp=0")], 3, step=1)
    suspended = run(backend, clock, [job(1, "mem=20000,period=10,ramp=0", duty=0.0)], 5, step=1)
    assert {job_memory(s, 1) for s in suspended} == {job_memory(before, 1)}
    assert {s.gpus[0].util_sm for s in suspended} == {0.0}


# ---------------------------------------------------------------- out of memory


def test_the_job_whose_growth_overflows_the_gpu_runs_out_of_memory():
    clock = Clock()
    backend = SimulatedBackend("1xT4-16GB", "n1", clock=clock)  # 15360 MiB
    resident = job(1, "idle:mem=9000,ramp=0")
    grower = job(2, "mem=8000,ramp=4")
    run(backend, clock, [resident], 1)
    samples = run(backend, clock, [resident, grower], 10, step=0.5)
    [oom] = [o for s in samples for o in s.out_of_memory]
    assert oom.job_id == 2 and oom.gpu_index == 0
    assert oom.error.startswith("CUDA out of memory (simulated) on GPU 0: job 2 needs ")
    assert "the GPU has 15360 MiB of which 9000 MiB are held by other jobs" in oom.error
    after = samples[-1]
    assert [j.job_id for j in after.jobs] == [1]  # the killed job's memory is freed
    assert max(s.gpus[0].mem_used_mib for s in samples) <= 15360


def test_the_grower_is_blamed_even_when_it_started_first():
    clock = Clock()
    backend = SimulatedBackend("1xT4-16GB", "n1", clock=clock)
    grower = job(1, "mem=9000,ramp=0,period=10")  # saws from 6300 up to 9000
    newcomer = job(2, "idle:mem=8000,ramp=0")
    run(backend, clock, [grower], 1)
    samples = run(backend, clock, [grower, newcomer], 10, step=0.5)
    # The newcomer arrives at 6300 + 8000 < 15360; later the sawtooth of job 1 pushes it over.
    assert [o.job_id for s in samples for o in s.out_of_memory] == [1]


def test_of_two_growing_jobs_the_one_started_last_runs_out():
    clock = Clock()
    backend = SimulatedBackend("1xT4-16GB", "n1", clock=clock)
    jobs = [job(1, "mem=9000,ramp=2"), job(2, "mem=9000,ramp=2")]
    samples = run(backend, clock, jobs, 6, step=0.5)
    assert [o.job_id for s in samples for o in s.out_of_memory] == [2]


def test_a_job_over_its_memory_limit_runs_out_of_memory():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB", "n1", clock=clock)
    samples = run(backend, clock, [job(1, "idle:mem=6000,ramp=2", limit=5000)], 3, step=0.5)
    [oom] = [o for s in samples for o in s.out_of_memory]
    assert oom.job_id == 1 and "over its limit of 5000 MiB" in oom.error


def test_default_peak_stays_inside_the_memory_limit():
    clock = Clock()
    backend = SimulatedBackend("1xA100-80GB", "n1", clock=clock)
    samples = run(backend, clock, [job(1, limit=10000)], 40, step=0.5)
    assert not any(s.out_of_memory for s in samples)
    assert 8500 < max(job_memory(s, 1) for s in samples) <= 9000


# ---------------------------------------------------------------- determinism, topology, XIDs


def test_same_seed_and_clock_give_the_same_readings():
    def readings(seed):
        clock = Clock()
        backend = SimulatedBackend("2xA100-80GB", "n1", seed=seed, clock=clock)
        return run(backend, clock, [job(1), job(2, "inference", gpus=(1,))], 20, step=1)

    assert readings(7) == readings(7)
    assert readings(7) != readings(8)


def test_readings_are_valid_wire_samples():
    clock = Clock()
    backend = SimulatedBackend("2xT4-16GB", "n1", clock=clock)
    backend.inject_xid(1, 79)
    [sample] = run(backend, clock, [job(1, "inference")], 1, step=1)
    message = protocol.NodeSample(node="n1", ts=1.0, seq=0, gpus=sample.gpus, jobs=sample.jobs,
                                  unattributed_mib=sample.unattributed_mib, running_jobs=[1])
    assert protocol.decode_sample(protocol.encode(message)) == message
    assert [g.xid_events for g in sample.gpus] == [[], [79]]
    assert [g.xid_events for g in run(backend, clock, [], 1, step=1)[0].gpus] == [[], []]


def test_topology_of_simulated_servers():
    def kinds(spec):
        return {(link.a, link.b): (link.kind, link.bandwidth_gbps) for link in SimulatedBackend(spec, "n1").topology()}

    a100 = kinds("8xA100-80GB")
    assert len(a100) == 28 and set(a100.values()) == {("nvlink", 2400.0)}
    t4 = kinds("4xT4-16GB")
    assert t4[(0, 1)] == ("pcie_switch", None) and t4[(0, 2)] == ("pcie_host_bridge", None)
    v100 = kinds("8xV100-32GB")
    assert v100[(0, 3)] == ("nvlink", 400.0) and v100[(3, 4)] == ("system", None)
    mixed = kinds("1xA100-80GB,1xT4-16GB")
    assert mixed == {(0, 1): ("system", None)}
