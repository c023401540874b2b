"""``colony cancel``: one job by id (as before), several ids, or every job that matches ``--array``,
``--name`` (a shell-style pattern) and ``--mine`` together, as ``scancel`` takes them.

A selection is shown and confirmed first (``--yes`` skips the question), then the jobs shown,
and only those, go to ``POST /api/v1/jobs/cancel/`` in one request: a job that matches only
after the question was asked is not cancelled. The answer says what was cancelled, what is
being stopped, and what was left and why (ended meanwhile, someone else's).
"""

from __future__ import annotations

import argparse
import sys

from cluster_ui.cli.client import Client, Usage
from cluster_ui.cli.submit import id_ranges

CANCELLABLE = "pending,placed,running,preempting"
MAX_JOBS = 10_000  # what the API takes in one request
SHOWN = 20  # jobs listed before the question; the rest are counted


def add_arguments(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument("ids", nargs="*", type=int, metavar="ID", help="job id(s)")
    cancel.add_argument("--array", type=int, metavar="ID", help="every unfinished job of this array")
    cancel.add_argument("--name", metavar="PATTERN", help="every unfinished job whose name matches, e.g. 'sweep-*' "
                                                          "(* any text, ? one character; quote it)")
    cancel.add_argument("--mine", action="store_true", help="only my jobs; alone: every unfinished job of mine")
    cancel.add_argument("-y", "--yes", action="store_true", help="do not ask before cancelling a selection")


def cmd_cancel(client: Client, args) -> tuple[object, str]:
    selecting = args.array is not None or args.name is not None or args.mine
    if args.ids and selecting:
        raise Usage("give job ids, or select with --array, --name and --mine, not both")
    if not args.ids and not selecting:
        raise Usage("say what to cancel: job ids, or --array ID, --name PATTERN, --mine")
    if len(args.ids) == 1:
        return _cancel_one(client, args.ids[0])
    if args.ids:
        return _cancel_many(client, list(dict.fromkeys(args.ids)))
    if args.name is not None and not args.name.strip():
        raise Usage("--name takes a pattern, e.g. --name 'sweep-*'")
    jobs = matching_jobs(client, args)
    if not jobs:
        return {"cancelled": [], "stopping": [], "skipped": []}, f"No unfinished job {_selection(args)}."
    if not args.yes and not confirmed(jobs, args):
        return None, "Nothing cancelled."
    return _cancel_many(client, [job["id"] for job in jobs])


def _cancel_one(client: Client, job_id: int) -> tuple[object, str]:
    job = client.post(f"api/v1/jobs/{job_id}/cancel/")
    if job["state"] == "CANCELLED":
        return job, f"Cancelled job {job['id']}."
    return job, f"Stopping job {job['id']} ({job['state'].lower()}): its node was told to end it."


def _cancel_many(client: Client, ids: list[int]) -> tuple[object, str]:
    answer = client.post("api/v1/jobs/cancel/", {"ids": ids})
    return answer, outcome_text(answer)


def matching_jobs(client: Client, args) -> list[dict]:
    """The unfinished jobs the selection names, as the queue API lists them (every page)."""
    query = {"state": CANCELLABLE, "array": args.array, "name": args.name, "owner": "me" if args.mine else None}
    jobs, page = [], 1
    while True:
        answer = client.get("api/v1/queue/", page=page, **query)
        jobs += answer["results"]
        if not answer.get("next"):
            return sorted(jobs, key=lambda job: job["id"])
        if len(jobs) >= MAX_JOBS:
            raise Usage(f"more than {MAX_JOBS:,} jobs match {_selection(args)}; narrow it (--array, --name, --mine)")
        page += 1


def confirmed(jobs: list[dict], args) -> bool:
    """Show what would be cancelled and ask; on stderr, so that stdout stays the answer."""
    count = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}"
    lines = [f"{count} {_selection(args)}:"]
    for job in jobs[:SHOWN]:
        index = f"[{job['array_index']}]" if job.get("array_index") is not None else ""
        lines.append(f"  {job['id']:>8}  {job['name'] + index:<32} {job['owner']:<12} {job['state'].lower()}")
    if len(jobs) > SHOWN:
        lines.append(f"  … and {len(jobs) - SHOWN} more")
    print("\n".join(lines), file=sys.stderr)
    print(f"Cancel {'these' if len(jobs) != 1 else 'this'} {count}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer:
        raise Usage("no answer to the question (is stdin a terminal?); give --yes to cancel without asking")
    return answer.strip().lower() in ("y", "yes")


def _selection(args) -> str:
    words = []
    if args.array is not None:
        words.append(f"of array {args.array}")
    if args.name is not None:
        words.append(f"named like {args.name!r}")
    if args.mine:
        words.append("of yours")
    return " ".join(words) or "selected"


def outcome_text(answer: dict) -> str:
    lines = []
    if answer["cancelled"]:
        lines.append(f"Cancelled {_jobs(answer['cancelled'])}.")
    stopping = answer["stopping"]
    if stopping:
        told = "its node was told to end it" if len(stopping) == 1 else "their nodes were told to end them"
        lines.append(f"Stopping {_jobs(stopping)}: {told}.")
    for skipped in answer["skipped"]:
        lines.append(f"Left job {skipped['id']}: {skipped['reason']}")
    return "\n".join(lines) or "Nothing cancelled."


def _jobs(ids: list[int]) -> str:
    return f"{len(ids)} job{'s' if len(ids) != 1 else ''} ({id_ranges(ids)})"
