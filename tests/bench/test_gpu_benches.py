"""The GPU benches' pure parts (their reading of a job's progress, their verdicts, their options)
and their refusal to run without a GPU. What they measure needs a GPU and is not tested here."""

from __future__ import annotations

import sys

import pytest

from bench import gpu_duty_cycle as duty
from bench import gpu_isolation as isolation


# ---------------------------------------------------------------- no GPU: fail fast, say why


@pytest.mark.parametrize("bench", [duty, isolation])
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
    assert lines[1].startswith("PASS: the guaranteed job keeps >= 95% of its solo throughput")
    assert "(worst: 96.0%, shared at 1.00)" in lines[1]
    table = duty.table(steps, 100.0, 100.0)
    assert "shared         1.00 |       50.0   50.0%" in table


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
