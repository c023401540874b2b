"""The probe bench replays a changed setting beside LAS on the same trace (figures not checked)."""

from __future__ import annotations

import pytest

from bench import philly_probe


def test_a_setting_is_read_with_its_fields_type_and_a_wrong_one_is_refused():
    assert philly_probe.settings(["borrower_turnover_gpu_s=7200", "turnover_when_blocked=false"]) == {
        "borrower_turnover_gpu_s": 7200.0, "turnover_when_blocked": False}
    for wrong in ("no_such_field=1", "duty_cycle_floor", "turnover_when_blocked=maybe"):
        with pytest.raises(ValueError):
            philly_probe.settings([wrong])


def test_the_changed_setting_reaches_the_replay_and_both_las_are_its_pairs():
    (plain,) = philly_probe.compare({}, ["2017-11-01"], [0], 0.35, workers=1)
    (off,) = philly_probe.compare({"borrower_turnover_gpu_s": 0.0}, ["2017-11-01"], [0], 0.35, workers=1)
    assert plain[3:] == off[3:]  # (neither LAS reads fair_share's settings)
    assert plain[2]["preemptions"] != off[2]["preemptions"]  # turnover off: fewer borrowers preempted
    assert plain[3] != plain[4]  # (LAS keeping the guarantees preempts less)
    lines, geomean, geomean_kept = philly_probe.report([plain])
    assert geomean == pytest.approx(plain[2]["avg"] / plain[3]["avg"])
    assert geomean_kept == pytest.approx(plain[2]["avg"] / plain[4]["avg"])
    assert lines[1].startswith("2017-11-01")
