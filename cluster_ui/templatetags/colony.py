"""Template filters for the dashboard. Sizes, durations, cores and GPU requests are worded by
:mod:`agents.units`, as ``static/js/colony.js`` words them when a page refreshes itself."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta

from django import template
from django.utils import timezone

from agents import units

register = template.Library()


@register.filter
def duration(value) -> str:
    """Seconds or a timedelta -> '45 s', '3 min 05 s', '2 h 05 min', '3 d 4 h'; None -> ''."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return units.format_duration(value)


@register.filter
def elapsed(start, end=None) -> str:
    """From one moment to another (to now without ``end``), worded as ``duration``: what the page's
    script then keeps up to date (``Colony.duration(Colony.since(...))``)."""
    if not start:
        return ""
    return duration((end or timezone.now()) - start)


@register.filter
def cores(milli) -> str:
    """Milli-cores -> '8 CPU cores' / '0.5 CPU cores' / '1 CPU core'."""
    return units.format_cores(milli)


@register.filter
def mib(value) -> str:
    """MiB -> '20 GiB' / '20.5 GiB' / '512 MiB'; None -> '—'."""
    return units.format_mib(value)


@register.filter
def gpu_request(job) -> str:
    """'2 GPUs', '1 GPU', '1/4 GPU' (with ' × 20 GiB' when memory is given)."""
    return units.format_gpu_request(job.gpus, job.gpu_milli, job.gpu_memory_mib)


@register.filter
def percent(value, digits: int = 0) -> str:
    if value is None or value == "":
        return "—"
    return f"{float(value):.{int(digits)}f}%"


@register.filter
def share(milli) -> str:
    """Thousandths of a GPU -> 'whole' / '1/4'."""
    return units.format_share(milli)


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
