"""Sizes, durations, CPU cores and GPU requests as people type and read them: one parser and one
formatter for each, used by the agent's flags, ``colony`` (the CLI), the submit form, the template
filters and the pending reasons. ``static/js/colony.js`` mirrors the formatters word for word;
``tests/units/cases.json`` is the table both are tested against.

Why in ``agents/``: the agent runs on GPU nodes without the web stack, so it can import nothing of
the server, and ``agents/`` is the one package a test keeps free of Django
(``tests/agents/test_no_django.py``); the server, the CLI and the pure scheduler core already
import plain-Python pieces from it (``agents.protocol``). Standard library only; no Django, no clock.

The rules, so that the same text means the same amount wherever it is typed:

- Sizes are binary whatever the suffix says (``GB`` is GiB: nobody sizes GPU memory in powers of
  ten, and two readings of "20GB" would be worse). A bare number is GiB, as researchers write
  memory; a caller whose input once meant something else passes ``bare=None`` and a bare number
  is refused with the accepted suffixes (the agent's ``--host-memory 20`` meant MiB).
- A duration needs its unit (``90m``, ``1h30m``, ``2 h 05 min``) or Slurm's clock form
  (``1-02:00:00``, ``2:00:00``, ``30:00``): a bare ``10`` could be seconds or minutes, and a job
  stopped 50 minutes early is a day lost.
- Formatters round half up (``floor(x + 0.5)``), as JavaScript's ``Math.round`` does, so that the
  page's script and the server print the same digits.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

BARE_SIZE_UNIT = "GiB"

_BYTES_PER = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:([kmgt])(?:ib?|b)?|(b))?\s*$", re.IGNORECASE)
SIZE_SUFFIXES = "K, M, G or T, with or without iB"

_SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_WORDS = {
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "d": "d", "day": "d", "days": "d",
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*[a-z]+\s*)+$", re.IGNORECASE)
# Slurm's --time: M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_CLOCK = re.compile(r"^\s*(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+):(\d+)(?::(\d+))?)\s*$")
_BARE_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")


def _half_up(value: float) -> int:
    return math.floor(value + 0.5)


# ---------------------------------------------------------------- sizes


def parse_size(text: str, unit: str = "MiB", *, bare: str | None = BARE_SIZE_UNIT) -> int:
    """'20GiB', '20 GB', '512M', '1.5T', '64KiB' -> a whole number of ``unit`` (B, KiB, MiB, GiB,
    TiB), rounded. ``bare``: the unit of a number given without one, or None to refuse it."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (a number and a unit: 512MiB, 20GiB, 1.5T; {SIZE_SUFFIXES})")
    number, prefix, byte = match.groups()
    if prefix is None and byte is None:
        if bare is None:
            number = text.strip()
            raise ValueError(f"give {number!r} a unit: {number}GiB or {number}MiB ({SIZE_SUFFIXES})")
        prefix = _prefix(bare)
    size = float(number) * _BYTES_PER[(prefix or "").lower()]
    return _half_up(size / _BYTES_PER[_prefix(unit)])


def _prefix(unit: str) -> str:
    prefix = unit.strip().lower()[:1]
    return "" if prefix == "b" else prefix


def format_bytes(size: float | None) -> str:
    """1536 -> '1.5 KiB', 20 GiB -> '20 GiB', 150.4 GiB -> '150 GiB'; None -> '—'."""
    return _scaled(size, ("B", "KiB", "MiB", "GiB", "TiB"))


def format_mib(mib: float | None) -> str:
    """512 -> '512 MiB', 20480 -> '20 GiB', 20992 -> '20.5 GiB', 0 -> '0 MiB'; None -> '—'."""
    return _scaled(mib, ("MiB", "GiB", "TiB"))


def _scaled(value: float | None, names: tuple[str, ...]) -> str:
    """In the largest unit that keeps it at least 1; one decimal below 100 unless it is whole (above
    100 a decimal is noise), none in the smallest unit."""
    if value is None or value == "":
        return "—"
    value, step = max(0.0, float(value)), 0
    while _half_up(value) >= 1024 and step < len(names) - 1:
        value, step = value / 1024, step + 1
    if step == 0 or value >= 100:
        return f"{_half_up(value)} {names[step]}"
    tenths = _half_up(value * 10)
    return f"{tenths // 10} {names[step]}" if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10} {names[step]}"


# ---------------------------------------------------------------- durations


def parse_duration(text: str) -> int:
    """'90m', '4h', '2d', '45s', '1h30m', '2 h 05 min', '1.5h', or Slurm's '1-02:00:00', '2:00:00',
    '30:00' (minutes:seconds) -> whole seconds. A bare number is refused: say which unit."""
    text = str(text)
    if _BARE_NUMBER.match(text):
        number = text.strip()
        raise ValueError(f"give {number!r} a unit: {number}s, {number}m, {number}h or {number}d")
    clock = _CLOCK.match(text)
    if clock:
        days, day_hours, day_minutes, day_seconds, minutes_or_hours, middle, last = clock.groups()
        if days is not None:
            parts = (int(days), int(day_hours), int(day_minutes or 0), int(day_seconds or 0))
        elif last is None:
            parts = (0, 0, int(minutes_or_hours), int(middle))
        else:
            parts = (0, int(minutes_or_hours), int(middle), int(last))
        return parts[0] * 86400 + parts[1] * 3600 + parts[2] * 60 + parts[3]
    if _DURATION.match(text):
        seconds = 0.0
        for number, word in _DURATION_PART.findall(text):
            unit = _UNIT_WORDS.get(word.lower())
            if unit is None:
                break
            seconds += float(number) * _SECONDS_PER[unit]
        else:
            return _half_up(seconds)
    raise ValueError(f"not a duration: {text!r} (try 90s, 45m, 4h, 1h30m, 2d or 1-02:00:00)")


def format_duration(seconds: float | None) -> str:
    """'45 s', '3 min 05 s', '2 h 05 min', '3 d 4 h': at most two units, the smaller one padded and
    left out when it is zero ('5 min', '2 h'), so that it reads in a sentence too; days from 48 h.
    None -> ''."""
    if seconds is None or seconds == "":
        return ""
    total = max(0, _half_up(float(seconds)))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def parse_time(iso: str | None) -> datetime | None:
    """An API timestamp ('…Z' or '+00:00') -> an aware datetime; None or '' -> None."""
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def seconds_between(start: str | None, end: str | None = None, now: datetime | None = None) -> float | None:
    """Seconds from one API timestamp to another (to ``now``, default the wall clock, when
    ``end`` is None); None without a start."""
    begin = parse_time(start)
    if begin is None:
        return None
    return ((parse_time(end) or now or datetime.now(timezone.utc)) - begin).total_seconds()


# ---------------------------------------------------------------- cores and GPUs


def _thousandths(milli: int) -> str:
    """1500 -> '1.5', 250 -> '0.25', 8000 -> '8': exact, where a float's repr might not be."""
    whole, rest = divmod(int(milli), 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def format_cores(milli: int) -> str:
    """Milli-cores -> '8 CPU cores', '0.5 CPU cores', '1 CPU core'."""
    text = _thousandths(milli)
    return f"{text} CPU core" if text == "1" else f"{text} CPU cores"


def format_share(milli: int | None) -> str:
    """Thousandths of one GPU -> '1/4', '1/2', '0.3'; a whole GPU (or none given) -> 'whole'."""
    if not milli or milli >= 1000:
        return "whole"
    divisor = math.gcd(int(milli), 1000)
    if divisor == milli:
        return f"1/{1000 // divisor}"
    return _thousandths(milli)


def format_gpu_request(gpus: int, gpu_milli: int | None = None, gpu_memory_mib: int | None = None) -> str:
    """'2 GPUs', '1 GPU', '1/4 GPU', with ' × 20 GiB' when memory per GPU is asked for."""
    if gpu_milli and gpu_milli < 1000:
        text = f"{format_share(gpu_milli)} GPU"
    else:
        text = f"{gpus} GPU" if gpus == 1 else f"{gpus} GPUs"
    if gpu_memory_mib:
        text += f" × {format_mib(gpu_memory_mib)}"
    return text


def parse_gpu_share(fraction: str) -> int:
    """'0.25' or '1/4' -> 250 thousandths of a GPU."""
    try:
        if "/" in fraction:
            top, bottom = fraction.split("/", 1)
            value = float(top) / float(bottom)
        else:
            value = float(fraction)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"not a fraction: {fraction!r} (try 0.25 or 1/4)") from None
    if not 0 < value <= 1:
        raise ValueError(f"a GPU fraction is between 0 and 1, got {fraction!r}")
    return max(1, _half_up(value * 1000))
