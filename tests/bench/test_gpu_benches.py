"""The GPU benches' pure parts (their reading of a job's progress, their verdicts, their options)
and their refusal to run without a GPU. What they measure needs a GPU and is not tested here."""

from __future__ import annotations

import sys

import pytest

from bench import gpu_attribution as attribution
from bench import gpu_duty_cycle as duty
from bench import gpu_isolation as isolation


# ---------------------------------------------------------------- no GPU: fail fast, say why


@pytest.mark.parametrize("bench", [duty, isolation, attribution])
def test_without_a_gpu_a_bench_says_what_is_missing_and_runs_nothing(bench, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML binding, as on this machine
    assert bench.main(["--json", str(tmp_path / "out.json")]) == 2
    assert "needs an NVIDIA GPU, and NVML finds none" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("bench", [duty, isolation])
def test_help_works_without_a_gpu(bench, capsys):
    with pytest.raises(SystemExit) as exit:
        bench.parse_args(["--help"])
    assert exit.value.code == 0 and "--isolation" in capsys.readouterr().out


@pytest.mark.parametrize("duties", ["1,0", "1.5", "half"])
def test_duty_cycles_outside_0_1_are_refused(duties, capsys):
    with pytest.raises(SystemExit):
        duty.parse_args(["--duties", duties])
    assert "--duties" in capsys.readouterr().err


# ---------------------------------------------------------------- reading a job's progress


def test_a_stopped_job_s_time_counts_against_its_rate():
    # 100 it/s for half of each second, stopped (no lines, no progress) the other half.
    points, count = [], 0
    for tenth in range(40):
        if tenth % 10 < 5:
            count += 10
            points.append((1000.0 + tenth / 10, count))
    text = "\n".join(f"{t:.6f} {n}" for t, n in points) + "\n1003.9"  # the last line cut short by SIGSTOP
    assert duty.parse_progress(text) == points
    assert duty.iterations_per_second(points, 1000.0, 1003.0) == pytest.approx(50.0, rel=0.05)
    assert duty.iterations_per_second(points, 999.0, 1001.0) is None  # before its first line


def test_duty_verdict_names_the_worst_step():
    steps = [duty.Step("duty alone", 1.0, opportunistic=100.0), duty.Step("duty alone", 0.5, opportunistic=49.0),
             duty.Step("duty alone", 0.25, opportunistic=20.0),
             duty.Step("shared", 1.0, opportunistic=50.0, guaranteed=96.0),
             duty.Step("shared", 0.25, opportunistic=20.0, guaranteed=99.0)]
    ok, lines = duty.verdict(steps, 100.0, 100.0, tolerance=0.10, guaranteed_target=0.95)
    assert not ok
    assert lines[0] == ("FAIL: the opportunistic job tracks its duty cycle within 10% "
                        "(worst: 20.0% of solo at duty 0.25, off by 20.0%)")
    assert lines[1].startswith("PASS: at duty 0.25 the guaranteed job keeps >= 95% of its solo throughput (99.0%")
    assert "worst step: 96.0%, shared at 1.00" in lines[1]
    assert len(lines) == 2  # nothing slowed past the margin: no signal to check
    table = duty.table(steps, 100.0, 100.0)
    assert "shared         1.00 |       50.0   50.0%" in table


def shared_steps(guaranteed_util_at_full: float | None, gpu_util: float | None = 90.0) -> list:
    """The H100's shape: an unthrottled neighbour costs the guaranteed job a third, the floor ~3%."""
    return [duty.Step("duty alone", 1.0, opportunistic=390.0), duty.Step("duty alone", 0.1, opportunistic=40.0),
            duty.Step("shared", 1.0, opportunistic=200.0, guaranteed=380.0, guaranteed_util=guaranteed_util_at_full,
                      gpu_util=gpu_util),
            duty.Step("shared", 0.1, opportunistic=20.0, guaranteed=560.0, guaranteed_util=97.0, gpu_util=gpu_util)]


def judge(steps, solo_util):
    return duty.verdict(steps, 390.0, 573.0, tolerance=0.10, guaranteed_target=0.95, slowdown_margin=0.1,
                        saturated_utilisation=0.95, solo_guaranteed_util=solo_util)


def test_a_slowdown_the_scheduler_can_see_passes_and_one_it_cannot_fails():
    ok, lines = judge(shared_steps(60.0), 100.0)
    assert ok, lines
    assert lines[1].startswith("PASS: at duty 0.10 the guaranteed job keeps >= 95% of its solo throughput (97.7%")
    assert "worst step: 66.3%, shared at 1.00" in lines[1]
    assert lines[2] == ("PASS: the scheduler throttles at each of the 1 slowdowns of the guaranteed job past 10%: "
                        "1 seen in its own utilisation (more than 10 points below solo, 100%), 0 with the GPU "
                        "saturated (>= 95%, a rule that fires slowed or not)")

    # NVML still says ~100% for a job that time-slicing slowed by a third, and the GPU is not
    # saturated: throttling never starts.
    ok, lines = judge(shared_steps(95.0), 100.0)
    assert not ok
    assert lines[2] == ("FAIL: the scheduler cannot see the guaranteed job's slowdown (solo reading 100%; "
                        "shared at 1.00: 66% of solo throughput, job 95%, GPU 90%)")

    # On an MPS GPU per-job utilisation is unknown: the GPU's saturation is what is left.
    ok, lines = judge(shared_steps(None, gpu_util=None), None)
    assert not ok and lines[2].endswith("(solo reading no reading; shared at 1.00: 66% of solo throughput, "
                                        "job ?, GPU ?)")
    ok, lines = judge(shared_steps(None, gpu_util=99.0), None)
    assert ok and lines[2].endswith("0 seen in its own utilisation (more than 10 points below solo, no reading), "
                                    "1 with the GPU saturated (>= 95%, a rule that fires slowed or not)")


def test_the_bench_reads_utilisation_through_the_agent_s_backend():
    from types import SimpleNamespace

    from agents.backends.base import BackendSample
    from agents.isolation.layer import IsolationLayer
    from agents.protocol import GpuInfo, GpuSample, JobGpuSample, LaunchJob

    readings = iter([(90.0, 40.0), (70.0, 50.0), (80.0, 45.0)])

    class Backend:
        def sample(self, jobs):
            assert set(jobs) == {11, 12}  # what the runner says runs, as the agent passes it
            guaranteed, opportunistic = next(readings)
            return BackendSample(gpus=[GpuSample(index=0, util_sm=99.0)],
                                 jobs=[JobGpuSample(job_id=11, gpu_index=0, mem_used_mib=1, util_sm=guaranteed),
                                       JobGpuSample(job_id=12, gpu_index=0, mem_used_mib=1, util_sm=opportunistic),
                                       JobGpuSample(job_id=12, gpu_index=1, mem_used_mib=1, util_sm=1.0)])

    clock = [1000.0]
    runner = SimpleNamespace(processes=lambda: {11: object(), 12: object()})
    gpu = GpuInfo(index=0, uuid="GPU-0", model="H100", memory_mib=81559)
    bench = duty.Bench.__new__(duty.Bench)
    bench.clock = lambda: clock[0]
    bench.sleep = lambda seconds: clock.__setitem__(0, clock[0] + seconds)
    bench.node = SimpleNamespace(backend=Backend(), runner=runner, layer=IsolationLayer([gpu], {0: "unfenced"}))
    bench.args = SimpleNamespace(gpu=0)
    assert bench.read_agent({duty.GUARANTEED: 11, duty.OPPORTUNISTIC: 12}, until=1003.0) == {
        f"util_{duty.GUARANTEED}": 80.0, f"util_{duty.OPPORTUNISTIC}": 45.0, "util_gpu": 99.0}

    # Two MPS clients on one GPU: the agent reports their utilisation as unknown; so does the bench.
    readings = iter([(90.0, 40.0)] * 3)
    bench.node.layer = IsolationLayer([gpu], {0: "mps"})
    for job_id in (11, 12):
        bench.node.layer.adopt(LaunchJob(command_id=f"c{job_id}", job_id=job_id, argv=["x"], gpu_indices=[0]))
    assert bench.read_agent({duty.GUARANTEED: 11, duty.OPPORTUNISTIC: 12}, until=1006.0) == {
        f"util_{duty.GUARANTEED}": None, f"util_{duty.OPPORTUNISTIC}": None, "util_gpu": 99.0}


# ---------------------------------------------------------------- who got the OOM


def outcome(opportunistic: str, guaranteed: str, running: bool = True) -> isolation.Outcome:
    result = isolation.Outcome(cap_mib=8192, step_mib=512, guaranteed_running_after=running,
                               guaranteed_rate_before=100.0, guaranteed_rate_after=99.0)
    isolation.read_status(opportunistic, result, isolation.OPPORTUNISTIC)
    isolation.read_status(guaranteed, result, isolation.GUARANTEED)
    return result


def test_fenced_the_opportunistic_job_gets_the_oom_at_its_cap():
    ok, lines = isolation.verdict(outcome("held 7168\nfailed 7168 CUDA out of memory. Tried to allocate 512 MiB",
                                          "ready 20480\ngrew 24576\n"))
    assert ok
    assert lines[0].startswith("opportunistic job: allocation failed holding 7168 MiB, at its cap of 8192 MiB")
    assert lines[-1] == "PASS: the opportunistic job got the OOM; the guaranteed job ran on"


def test_unfenced_the_guaranteed_job_pays():
    ok, lines = isolation.verdict(outcome("held 59000\nfailed 59392 CUDA out of memory.",
                                          "ready 20480\ngrow failed CUDA out of memory. Tried to allocate 4.00 GiB",
                                          running=False))
    assert not ok
    assert "past its cap (the GPU was full: nothing fenced it)" in lines[0]
    assert lines[1] == ("guaranteed job: GOT THE OOM growing inside its reservation: "
                        "CUDA out of memory. Tried to allocate 4.00 GiB")
    assert lines[-1] == ("FAIL: the guaranteed job (and the opportunistic one) got the OOM; "
                         "the guaranteed job did not run on")


def test_the_gpu_session_script_runs_every_gpu_bench_and_each_says_at_once_why_not_here(tmp_path):
    # What a session lent a GPU runs first (bench/gpu_session.sh): kept runnable here, where it can
    # only fail fast, so that it has not rotted by the time a GPU is lent.
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(root), "WHEELS": "none"}
    done = subprocess.run(["bash", str(root / "bench" / "gpu_session.sh")], cwd=root, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "all.log").read_text()
    for bench, runs in (("gpu_isolation", 3), ("gpu_duty_cycle", 2), ("gpu_attribution", 2), ("gpu_fence", 1)):
        assert log.count(f"{bench}: it needs an NVIDIA GPU, and NVML finds none") == runs, log
    assert log.count("rc=2") == 8 and "=== end" in log
