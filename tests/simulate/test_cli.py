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


@pytest.mark.skipif(not TRACES_DIR.is_dir(), reason=f"public traces not found at {TRACES_DIR}")
def test_replay_prints_ratios_to_fifo_and_writes_json_and_an_offline_html_report(tmp_path):
    run = simulate("--trace", "alibaba", "--nodes", "4", "--first", "120", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "ratios are to fifo_exclusive" in run.stdout
    assert "allocated at 100% requested" in run.stdout  # fragmentation, on by default for alibaba
    document = json.loads((tmp_path / "replay.json").read_text())
    assert set(document["policies"]) == {"fair_share", "fifo_exclusive", "packing_without_quotas",
                                         "least_attained_service"}
    assert document["ratios_to_baseline"]["fifo_exclusive"]["avg JCT (h)"] == pytest.approx(1.0)
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
