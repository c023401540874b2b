"""The core's bench runs end to end on a small cluster (its figures are not checked here: benches
print, tests assert behaviour), and its steady cycle's carried decisions are the fresh ones."""

from __future__ import annotations

from bench import scheduler

SMALL = ["--nodes", "16", "--tenants", "6", "--running", "60", "--pending", "400", "--repeat", "1"]


def test_the_full_bench_runs_and_reports_each_policy(capsys):
    scheduler.main(SMALL)
    out = capsys.readouterr().out
    for line in ("fair_share (decide)", "fifo_exclusive", "packing_without_quotas", "fair_share, carried"):
        assert line in out


def test_the_steady_cycle_is_measured_fresh_and_carried(capsys):
    scheduler.main([*SMALL, "--steady"])  # (it asserts the carried decisions equal the fresh ones)
    out = capsys.readouterr().out
    assert "steady cycle:" in out and "same, carried" in out


def test_the_loop_snapshot_bench_decides_on_a_saved_pair(tmp_path, capsys):
    import pickle

    from bench import decide_snapshot
    from jobs.scheduling import SchedulerConfig

    snapshot = scheduler.build_snapshot(3, 16, 8, 6, 60, 400)
    path = tmp_path / "loop.pkl"
    later = scheduler.launched(snapshot, scheduler.decide(snapshot, scheduler.NOW))  # (what --save-snapshots writes)
    path.write_bytes(pickle.dumps({"steady": snapshot, "churn": later, "now": scheduler.NOW,
                                   "config": SchedulerConfig()}))
    decide_snapshot.main([str(path), "--cycles", "1"])
    out = capsys.readouterr().out
    assert "400 pending" in out and all(f"  {kind}" in out for kind in ("steady", "churn", "fresh"))


def test_the_loop_bench_runs_with_live_samples_from_every_node():
    """``bench/scheduling_loop.py --samples``: every node publishes what its agent would (jobs'
    utilisation scaled by their duty cycles), the loop settles, then is measured (a subprocess:
    the bench sets up Django and a database of its own)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "bench" / "scheduling_loop.py"), "--nodes", "4", "--tenants", "3",
                           "--running", "6", "--pending", "60", "--repeat", "1", "--samples", "--database", "sqlite"],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "settling cycles with live samples" in done.stdout and "steady cycle" in done.stdout
