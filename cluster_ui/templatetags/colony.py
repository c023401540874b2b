"""Template filters for the dashboard: the same wording as ``static/js/colony.js`` uses."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta
from fractions import Fraction

from django import template

register = template.Library()


@register.filter
def duration(value) -> str:
    """Seconds or a timedelta -> '45 s', '3 min 05 s', '2 h 10 min', '3 d 4 h'."""
    if value is None or value == "":
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def cores(milli) -> str:
    """Milli-cores -> '8 CPU cores' / '0.5 CPU cores' / '1 CPU core'."""
    text = f"{int(milli) / 1000:g}"
    return f"{text} CPU core" if text == "1" else f"{text} CPU cores"


@register.filter
def mib(value) -> str:
    """MiB -> '20 GiB' / '20.5 GiB' / '512 MiB'."""
    if value is None or value == "":
        return "—"
    value = float(value)
    if value >= 1024:
        gib = value / 1024
        return f"{gib:.0f} GiB" if gib >= 100 or gib == int(gib) else f"{gib:.1f} GiB"
    return f"{value:.0f} MiB"


@register.filter
def gpu_request(job) -> str:
    """'2 GPUs', '1 GPU', '1/4 GPU' (with ' x 20 GiB' when memory is given)."""
    if job.gpu_milli and job.gpu_milli < 1000:
        share = Fraction(job.gpu_milli, 1000)
        text = f"{share.numerator}/{share.denominator} GPU" if share.numerator == 1 else f"{job.gpu_milli / 1000:g} GPU"
    else:
        text = f"{job.gpus} GPU{'s' if job.gpus != 1 else ''}"
    if job.gpu_memory_mib:
        text += f" × {mib(job.gpu_memory_mib)}"
    return text


@register.filter
def percent(value, digits: int = 0) -> str:
    if value is None or value == "":
        return "—"
    return f"{float(value):.{int(digits)}f}%"


@register.filter
def share(milli) -> str:
    """Thousandths of a GPU -> 'whole' / '1/4'."""
    if not milli or milli >= 1000:
        return "whole"
    fraction = Fraction(milli, 1000)
    return f"{fraction.numerator}/{fraction.denominator}" if fraction.numerator == 1 else f"{milli / 1000:g}"


_PLAIN = re.compile(r"^[\w@%+=:,./-]+$")


def _readable_quote(word: str) -> str:
    if _PLAIN.match(word):
        return word
    if not re.search(r'["$`\\!]', word):
        return f'"{word}"'  # what most people type, and a shell reads it the same
    return shlex.quote(word)


@register.filter
def argv(command) -> str:
    """An argv list as one line you could paste into a shell."""
    if not isinstance(command, list):
        return str(command)
    return " ".join(_readable_quote(str(word)) for word in command)


@register.filter
def hours(value) -> str:
    """GPU-hours: '12.5', '0.042' (small amounts keep their digits), '0'."""
    value = float(value or 0)
    if value == 0:
        return "0"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 1 else f"{value:.3f}"
