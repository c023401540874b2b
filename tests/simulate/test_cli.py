"""``python -m jobs.scheduling.simulate`` as an operator runs it: table, JSON, HTML, exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.scheduling.simulate.loaders import TRACES_DIR

ROOT = Path(__file__).resolve().parents[2]


def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.scheduling.simulate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not TRACES_DIR.is_dir(), reason=f"public traces not found at {TRACES_DIR}")
def test_replay_prints_ratios_to_fifo_and_writes_json_and_an_offline_html_report(tmp_path):
    run = simulate("--trace", "alibaba", "--nodes", "4", "--first", "120", "--out", str(tmp_path),
                   "--policies", "fair_share,fifo_exclusive,least_attained_service,fgd",
                   # Months-long pods sharing GPUs under interference keep AIMD adjusting every cycle: slow.
                   "--interference", "0")
    assert run.returncode == 0, run.stderr
    assert "ratios are to fifo_exclusive" in run.stdout
    assert "phys. alloc at 100% asked" in run.stdout  # fragmentation, on by default for alibaba
    document = json.loads((tmp_path / "replay.json").read_text())
    assert set(document["policies"]) == {"fair_share", "fifo_exclusive", "least_attained_service", "fgd"}
    assert document["ratios_to_baseline"]["fifo_exclusive"]["avg JCT (h) ~"] == pytest.approx(1.0)
    assert all(run["unfinished"] == 0 for run in document["policies"].values())
    html = (tmp_path / "replay.html").read_text()
    assert "Job completion time CDF" in html and "plotly" in html.lower()
    # plotly.js is inlined, not fetched: the report opens on an offline cluster.
    assert "<script src=" not in html.replace('<script src="data:', "") and "Plotly.newPlot" in html
    assert len(html) > 1_000_000


def test_unknown_policy_and_unreadable_trace_exit_2_with_a_reason(tmp_path):
    run = simulate("--policies", "fair_share,round_robin")
    assert run.returncode == 2 and "unknown policy: round_robin" in run.stderr
    garbage = tmp_path / "trace.json"
    garbage.write_bytes(b"\xff\xfe not json")
    run = simulate("--trace", str(garbage), "--out", str(tmp_path))
    assert run.returncode == 2 and "cannot read the trace" in run.stderr


@pytest.mark.skipif(not TRACES_DIR.is_dir(), reason=f"public traces not found at {TRACES_DIR}")
def test_fgd_protocol_prints_medians_over_seeds_beside_the_published_figures(tmp_path):
    run = simulate("--protocol", "fgd", "--pods", "default", "--nodes", "30", "--seeds", "2",
                   "--policies", "best_fit,fgd", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "FGD fill protocol, pod list default" in run.stdout and "BestFit 92.9" in run.stdout
    document = json.loads((tmp_path / "fgd.json").read_text())
    assert document["seeds"] == [0, 1] and set(document["policies"]) == {"best_fit", "fgd"}
    at_100 = document["policies"]["fgd"]["levels"]["100"]["physical"]
    assert at_100["n"] == 2 and 0 < at_100["min"] <= at_100["median"] <= at_100["max"] <= 1.0
