"""Sizes, durations and GPU shares as people type and read them."""

from __future__ import annotations

import re
from datetime import datetime, timezone

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d|day|days)?\s*$", re.IGNORECASE)
_MIB_PER = {"m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024, "t": 1024**2, "tb": 1024**2, "tib": 1024**2}
_SECONDS_PER = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "day": 86400, "days": 86400}


def size_mib(text: str) -> int:
    """'20GiB', '20 GB', '512MiB', '20' (GiB) -> MiB."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (try 20GiB or 512MiB)")
    return int(round(float(match.group(1)) * _MIB_PER[(match.group(2) or "gib").lower()]))


def duration_s(text: str, bare_unit: str | None = None) -> int:
    """'90m', '4h', '2d', '3600s' -> seconds. A bare number is refused unless ``bare_unit`` says
    what it means (a form field labelled in minutes): on a command line '10' could mean seconds or
    minutes, and a job stopped 50 minutes early is a day lost."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (try 90m, 4h or 2d)")
    unit = match.group(2) or bare_unit
    if unit is None:
        raise ValueError(f"give {text!r} a unit: {text}s, {text}m, {text}h or {text}d")
    return int(round(float(match.group(1)) * _SECONDS_PER[unit.lower()]))


def gpu_milli(fraction: str) -> int:
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
    return max(1, int(round(value * 1000)))


def human_mib(mib: float | None) -> str:
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


def parse_time(iso: str | None) -> datetime | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def seconds_between(start: str | None, end: str | None = None) -> float | None:
    begin = parse_time(start)
    if begin is None:
        return None
    return ((parse_time(end) or datetime.now(timezone.utc)) - begin).total_seconds()


def gpu_request(job: dict) -> str:
    milli = job.get("gpu_milli") or 1000
    text = f"{milli / 1000:g}" if milli < 1000 else str(job.get("gpus"))
    if job.get("gpu_memory_mib"):
        text += f"x{human_mib(job['gpu_memory_mib'])}".replace(" ", "")
    return text


def human_bytes(size: int) -> str:
    """1536 -> '1.5 KiB'; whole numbers above 100 ('180 KiB') because decimals there are noise."""
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{size} B"
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
