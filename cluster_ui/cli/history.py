"""``colony history``: your finished jobs, newest first, with what they cost and how much of it
they used (Slurm's ``sacct`` and ``seff`` in one table), from the queue API
(``state=finished&owner=me&ordering=-finished_at``, ``finished_after`` for ``--since``).

GPU-hours are what the job held: its GPUs (or share of one) times its run time. Use is what its
nodes measured: the GPUs' mean utilisation against the share it asked for, and its peak GPU
memory against the memory it asked for. Where the API has no measurement the column says ``-``.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone

from agents import units
from cluster_ui.cli.client import Client, Usage

HEADER = ["ID", "NAME", "STATE", "FINISHED (UTC)", "RUNTIME", "GPUS", "GPU-HOURS", "GPU USE", "MEMORY USE"]


def add_arguments(history: argparse.ArgumentParser) -> None:
    history.add_argument("--limit", type=int, default=20, help="at most this many jobs (default 20)")
    history.add_argument("--since", metavar="WHEN",
                         help="only jobs that ended since then: a duration back (7d, 12h) or a date or time "
                              "(2026-01-31, 2026-01-31T09:00; UTC unless it says)")


def cmd_history(client: Client, args) -> tuple[object, str]:
    if args.limit < 1:
        raise Usage("--limit takes a positive number")
    query = {"state": "finished", "owner": "me", "ordering": "-finished_at",
             "finished_after": since_time(args.since).isoformat() if args.since else None}
    jobs, page = [], 1
    while len(jobs) < args.limit:
        answer = client.get("api/v1/queue/", page=page, **query)
        jobs += answer["results"]
        if not answer.get("next"):
            break
        page += 1
    jobs = jobs[:args.limit]
    return jobs, history_table(jobs, args.since)


def since_time(text: str, now: datetime | None = None) -> datetime:
    """``7d`` -> seven days before now; ``2026-01-31`` or an ISO time -> that moment (UTC unless given)."""
    now = now or datetime.now(timezone.utc)
    try:
        return now - timedelta(seconds=units.parse_duration(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Usage(f"--since takes a duration back (7d, 12h) or a date (2026-01-31), not {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def gpu_request(job: dict) -> str:
    """'2 GPUs', '1/4 GPU × 10 GiB': as the dashboard words an API job."""
    return units.format_gpu_request(job["gpus"], job.get("gpu_milli"), job.get("gpu_memory_mib"))


def gpu_share(job: dict) -> float:
    """GPUs held: the count, or the share of one for a fractional job."""
    milli = job.get("gpu_milli") or 1000
    return milli / 1000 if milli < 1000 else float(job["gpus"])


def runtime_s(job: dict) -> float | None:
    return units.seconds_between(job["started_at"], job["finished_at"]) if job.get("started_at") else None


def gpu_hours(job: dict) -> float:
    return gpu_share(job) * (runtime_s(job) or 0) / 3600


def gpu_use(job: dict) -> float | None:
    """Measured GPU utilisation as a share of what was asked (a quarter GPU busy 25% is 100%)."""
    if job.get("mean_gpu_util") is None:
        return None
    return job["mean_gpu_util"] / (100 * min(gpu_share(job), 1.0))


def memory_use(job: dict) -> str:
    peak, asked = job.get("peak_gpu_memory_mib"), job.get("gpu_memory_mib")
    if not peak:
        return "-"
    if not asked:
        return f"peak {units.format_mib(peak)}"
    return f"{units.format_mib(peak)} of {units.format_mib(asked)} ({peak / asked:.0%})"


def history_table(jobs: list[dict], since: str | None) -> str:
    if not jobs:
        return f"No finished jobs{f' since {since}' if since else ''}."
    rows = []
    for job in jobs:
        finished = units.parse_time(job["finished_at"])
        name = job["name"] + (f"[{job['array_index']}]" if job.get("array_index") is not None else "")
        use = gpu_use(job)
        rows.append([str(job["id"]), name, job["state"],
                     finished.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M") if finished else "-",
                     units.format_duration(runtime_s(job)) or "-", gpu_request(job), f"{gpu_hours(job):.2f}",
                     "-" if use is None else f"{use:.0%}", memory_use(job)])
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [HEADER, *rows]]
    return "\n".join(lines + [summary(jobs)])


def summary(jobs: list[dict]) -> str:
    """Totals, and the use over the jobs that were measured, weighted by what each held."""
    held = sum(gpu_hours(job) for job in jobs)
    measured = [(gpu_hours(job), gpu_use(job)) for job in jobs if gpu_use(job) is not None and gpu_hours(job) > 0]
    text = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}, {held:.2f} GPU-hours"
    weight = sum(hours for hours, _ in measured)
    if weight:
        text += f"; GPU use {sum(hours * use for hours, use in measured) / weight:.0%} where measured"
    return text + "."
