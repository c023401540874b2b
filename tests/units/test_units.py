"""The one parser and formatter for sizes, durations, cores and GPU requests (``agents/units.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents import units

CASES = json.loads((Path(__file__).with_name("cases.json")).read_text())
FORMATTERS = {
    "duration": units.format_duration,
    "bytes": units.format_bytes,
    "mib": units.format_mib,
    "cores": units.format_cores,
    "share": units.format_share,
    "gpu_request": lambda job: units.format_gpu_request(**job),
}


@pytest.mark.parametrize("kind, value, expected",
                         [(kind, value, expected) for kind in FORMATTERS for value, expected in CASES[kind]])
def test_formatters_print_the_shared_table(kind, value, expected):
    assert FORMATTERS[kind](value) == expected


@pytest.mark.parametrize("text, mib", [
    ("20GiB", 20480), ("20 gb", 20480), ("20G", 20480), ("512MiB", 512), ("512 M", 512), ("1.5G", 1536),
    ("1T", 1048576), ("2TiB", 2097152), ("1024KiB", 1), ("20", 20480), ("0.5", 512), ("64Gi", 65536),
])
def test_sizes_read_binary_and_a_bare_number_is_gib(text, mib):
    assert units.parse_size(text) == mib


def test_sizes_in_other_units():
    assert units.parse_size("16M", "B", bare="B") == 16 * 2**20
    assert units.parse_size("65536", "B", bare="B") == 65536
    assert units.parse_size("1.5KiB", "B") == 1536
    assert units.parse_size("3GiB", "GiB") == 3


def test_a_caller_can_refuse_a_bare_size_with_the_suffixes_named():
    with pytest.raises(ValueError, match=r"give '20' a unit: 20GiB or 20MiB \(K, M, G or T, with or without iB\)"):
        units.parse_size("20", bare=None)
    assert units.parse_size("20MiB", bare=None) == 20


@pytest.mark.parametrize("text", ["lots", "", "20 GiBs", "-1G", "1e3", "20 PiB", "G"])
def test_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="not a size"):
        units.parse_size(text)


@pytest.mark.parametrize("text, seconds", [
    ("45s", 45), ("90m", 5400), ("4h", 14400), ("2d", 172800), ("1.5h", 5400), ("1h30m", 5400),
    ("1h 30m 10s", 5410), ("2 h 05 min", 7500), ("3 min 05 s", 185), ("3 d 4 h", 273600), ("2 days", 172800),
    ("90 minutes", 5400), ("1 hour", 3600),
    # Slurm's --time forms (colony submit --time is sbatch's flag)
    ("30:00", 1800), ("2:00:00", 7200), ("1-02:00:00", 93600), ("1-2", 93600), ("1-02:30", 95400),
])
def test_durations(text, seconds):
    assert units.parse_duration(text) == seconds


def test_a_bare_duration_is_refused_with_the_units_to_pick_from():
    with pytest.raises(ValueError, match=r"give '10' a unit: 10s, 10m, 10h or 10d"):
        units.parse_duration("10")


@pytest.mark.parametrize("text", ["soon", "", "4 fortnights", "h", "-5m", "1:2:3:4", "4h soon"])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="not a duration"):
        units.parse_duration(text)


@pytest.mark.parametrize("seconds", [0, 45, 185, 3600, 7500, 172800, 273600])
def test_a_printed_duration_reads_back(seconds):
    assert units.parse_duration(units.format_duration(seconds)) == seconds


@pytest.mark.parametrize("text, milli", [("0.25", 250), ("1/4", 250), ("1", 1000), ("1/3", 333)])
def test_gpu_shares(text, milli):
    assert units.parse_gpu_share(text) == milli


@pytest.mark.parametrize("text", ["0", "2", "half", "1/0"])
def test_what_is_not_a_gpu_share(text):
    with pytest.raises(ValueError):
        units.parse_gpu_share(text)
