"""The ``colony`` commands: login, submit, queue, show, logs, cancel, history (the last two in
their own modules, ``cancel`` and ``history``; batch scripts in ``script``).

Exit codes: 0 done; 1 the API refused or could not be reached; 2 a usage problem (bad flags,
no token). ``--json`` prints the API's JSON instead of text, errors included, for scripts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from datetime import datetime, timezone

from agents import units
from cluster_ui.cli import cancel, history, jupyter, login, shell, submit
from cluster_ui.cli.client import ApiError, Client, ConfigError, Usage, resolve
from cluster_ui.cli.submit import cmd_submit, default_name  # noqa: F401  (still importable from here)

OK, API_ERROR, USAGE = 0, 1, 2
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}
FOLLOW_INTERVAL_S = 1.0
GAP_NOTE = "[colony: output skipped here: the job wrote faster than it is shown live]\n"


# ---------------------------------------------------------------- commands


def cmd_queue(client: Client, args) -> tuple[object, str]:
    query = {"state": args.state or (None if args.all else "active"), "tenant": args.tenant,
             "owner": "me" if args.mine else args.owner}
    jobs, page = [], 1
    while True:
        answer = client.get("api/v1/queue/", page=page, **query)
        jobs += answer["results"]
        if not answer.get("next") or len(jobs) >= args.limit:
            break
        page += 1
    jobs = jobs[:args.limit]
    return jobs, queue_table(jobs)


def queue_table(jobs: list[dict]) -> str:
    if not jobs:
        return "No jobs."
    header = ["ID", "NAME", "TENANT", "OWNER", "STATE", "CLASS", "GPUS", "POS", "TIME", "NODES / REASON"]
    rows = []
    for job in jobs:
        if job["state"] == "PENDING":
            time = units.format_duration(units.seconds_between(job["submitted_at"])) or "-"
        else:
            time = units.format_duration(units.seconds_between(job["started_at"], job["finished_at"])) or "-"
        position = f"{job['queue_position']}/{job['queue_length']}" if job.get("queue_position") else "-"
        why = ",".join(job.get("nodes") or [])
        if job.get("pending_reason"):
            why = job["pending_reason"]["message"]
            if job.get("eta_s") is not None:
                why += f" (starts in ~{units.format_duration(job['eta_s'])})"
        run_class = job.get("run_class") or ("spare-only" if job.get("opportunistic_only") else "-")
        name = job["name"] + (f"[{job['array_index']}]" if job.get("array_index") is not None else "")
        rows.append([str(job["id"]), name, job["tenant"], job["owner"], job["state"], run_class,
                     history.gpu_request(job), position, time, why or "-"])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    limit = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else None
    for row in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
        lines.append(line[:limit - 1] + "…" if limit and len(line) > limit else line)
    return "\n".join(lines)


def cmd_show(client: Client, args) -> tuple[object, str]:
    job = client.get(f"api/v1/jobs/{args.id}/")
    lines = [
        f"Job {job['id']}: {job['name']}",
        f"  state       {job['state']}"
        + (f" (exit code {job['exit_code']})" if job.get("exit_code") is not None else ""),
        f"  tenant      {job['tenant']}   owner {job['owner']}",
        f"  request     {history.gpu_request(job)}, priority {job['priority']}"
        + (", spare capacity only" if job.get("opportunistic_only") else ""),
        f"  class       {job.get('run_class') or '-'}",
        f"  command     {shlex.join(job['command'])}",
        *contract_lines(job),
    ]
    if job.get("pending_reason"):
        lines.append(f"  pending     {job['pending_reason']['message']}")
        if job["pending_reason"].get("eta_at"):
            lines.append(f"  eta         {eta_text(job['pending_reason']['eta_at'])}")
    for label, field in (("submitted", "submitted_at"), ("placed", "placed_at"), ("started", "started_at"),
                         ("finished", "finished_at")):
        if job.get(field):
            lines.append(f"  {label:<11} {job[field]}")
    if job.get("peak_gpu_memory_mib"):
        lines.append(f"  peak memory {units.format_mib(job['peak_gpu_memory_mib'])}")
    for allocation in job.get("allocations", []):
        state = "released" if allocation.get("released_at") else "held"
        lines.append(f"  gpu         {allocation['node']}/{allocation['gpu_index']} {allocation['gpu_model']} "
                     f"share {units.format_share(allocation['gpu_milli'])} "
                     f"duty {allocation['duty_cycle']:.2f} ({state})")
    if job.get("error"):
        lines.append(f"  error       {job['error']}")
    return job, "\n".join(lines)


def eta_text(eta_at: str) -> str:
    """``"in ~12 min 05 s (14:05 UTC)"``: the scheduler's estimate, from now and on the clock (with
    the date when it is not today's)."""
    at = units.parse_time(eta_at).astimezone(timezone.utc)
    now = datetime.now(timezone.utc)
    clock = at.strftime("%H:%M UTC") if at.date() == now.date() else at.strftime("%Y-%m-%d %H:%M UTC")
    left = (at - now).total_seconds()
    return f"in ~{units.format_duration(left)} ({clock})" if left >= 1 else f"any moment now (due {clock})"


def contract_lines(job: dict) -> list[str]:
    """Where and how the job runs, what it waits for, what preemption cost it: only what is set."""
    lines = []
    if job.get("workdir"):
        lines.append(f"  workdir     {job['workdir']} (on the node)")
    if job.get("code"):
        lines.append(f"  code        uploaded, sha256 {job['code'][:12]}…")
    for field in ("image", "venv", "conda"):
        if job.get(field):
            lines.append(f"  {field:<11} {job[field]}")
    if job.get("mig_profile"):
        lines.append(f"  MIG         one {job['mig_profile']} instance")
    if job.get("accepts_unfenced") is not None:
        lines.append(f"  unfenced    {'shares' if job['accepts_unfenced'] else 'never shares'} unfenced GPUs")
    if job.get("array_id") is not None:
        lines.append(f"  array       {job['array_id']}, index {job.get('array_index')}")
    waits = [f"job {dep['job']} " + ("succeeds" if dep.get("kind") == "ok" else "ends")
             for dep in job.get("dependencies") or []]
    if waits:
        lines.append(f"  after       {', '.join(waits)}")
    notice = []
    if job.get("preempt_grace_s"):
        notice.append(f"{units.format_duration(job['preempt_grace_s'])} notice")
    if job.get("checkpoints"):
        notice.append("checkpoints")
    if notice:
        lines.append(f"  preemption  {', '.join(notice)}")
    if job.get("preemptions"):
        count = job["preemptions"]
        lost = f", {units.format_duration(job['lost_work_s'])} of work lost" if job.get("lost_work_s") else ""
        lines.append(f"  preempted   {count} time{'s' if count != 1 else ''}{lost}")
    return lines


def cmd_logs(client: Client, args) -> tuple[object, str | None]:
    """``colony logs N``: what the job printed so far. While it runs that is the output its nodes
    shipped live (what ``-f`` prints, ``GET .../logs/``); its ``output_tail`` is written when it ends."""
    if getattr(args, "follow", False):
        return follow_logs(client, args)
    job = client.get(f"api/v1/jobs/{args.id}/")
    result = {"id": job["id"], "state": job["state"], "output_tail": job.get("output_tail") or ""}
    if job["state"] not in TERMINAL:
        chunks, nodes = kept_output(client, job["id"])
        if chunks:
            text, _ = render_chunks(chunks, len(nodes) > 1, {})
            return {**result, "chunks": chunks}, text.rstrip("\n")
    if result["output_tail"]:
        return result, result["output_tail"].rstrip("\n")
    return result, "(no output yet)" if job["state"] not in TERMINAL else "(no output)"


def kept_output(client: Client, job_id: int) -> tuple[list[dict], list[str]]:
    """Every chunk of the job's live output still kept, oldest first, and the nodes that sent
    them: one answer holds a few hundred chunks at most, so each node is read on from its last."""
    path = f"api/v1/jobs/{job_id}/logs/"
    answer = client.get(path)
    chunks, nodes = list(answer["chunks"]), answer["nodes"]
    for node in nodes:
        cursor = next((chunk["id"] for chunk in reversed(chunks) if chunk["node"] == node), None)
        while True:
            more = client.get(path, node=node, **({"after": cursor} if cursor else {}))["chunks"]
            if not more:
                break
            chunks += more
            cursor = more[-1]["id"]
    chunks.sort(key=_chunk_order)
    return chunks, nodes


def render_chunks(chunks: list[dict], several_nodes: bool, line_start: dict[str, bool]) -> tuple[str, bool | None]:
    """The chunks as text, each line prefixed with its node when there are several (``line_start``
    carries where each node's last line ended); and whether the text ends a line (None: no text)."""
    out = []
    for chunk in chunks:
        text = (GAP_NOTE if chunk["gap"] else "") + chunk["data"]
        text, line_start[chunk["node"]] = _prefixed(text, f"[{chunk['node']}] " if several_nodes else "",
                                                    line_start.get(chunk["node"], True))
        out.append(text)
    text = "".join(out)
    return text, (text.endswith("\n") if text else None)


def _chunk_order(chunk: dict) -> tuple[int, ...]:
    return tuple(int(part) for part in chunk["id"].split("-"))


def follow_logs(client: Client, args) -> tuple[object, str | None]:
    """``colony logs -f``: print the job's output as its nodes ship it (``GET .../logs/``, one
    cursor per node, lines prefixed with the node when there are several) until the job has
    ended and its last output is in; then, if nothing came live, the job's output tail."""
    as_json = getattr(args, "json", False)
    path = f"api/v1/jobs/{args.id}/logs/"
    cursors: dict[str, str] = {}
    line_start: dict[str, bool] = {}
    shown, newline = 0, True
    answer = client.get(path)  # every node's kept output
    chunks = answer["chunks"]
    settled = 0  # rounds with nothing new since the job ended
    while True:
        nodes = answer["nodes"]
        for chunk in chunks:
            cursors[chunk["node"]] = chunk["id"]
            shown += 1
            if as_json:
                print(json.dumps(chunk), flush=True)
                continue
            text, ends_line = render_chunks([chunk], len(nodes) > 1, line_start)
            sys.stdout.write(text)
            sys.stdout.flush()
            newline = newline if ends_line is None else ends_line
        if answer["finished"]:
            settled = settled + 1 if not chunks else 0
            if settled >= 2:  # the last chunks of a job may land a moment after its exit
                break
        time.sleep(FOLLOW_INTERVAL_S)
        if not nodes:
            answer = client.get(path)
            chunks = answer["chunks"]
            continue
        chunks = []
        for node in nodes:  # one exact cursor per node
            answer = client.get(path, node=node, **({"after": cursors[node]} if node in cursors else {}))
            chunks += answer["chunks"]
        chunks.sort(key=_chunk_order)
    if shown == 0:
        result, text = cmd_logs(client, argparse.Namespace(id=args.id))
        return result, (None if as_json else text)
    if not as_json and not newline:
        sys.stdout.write("\n")
    return ({"id": args.id, "state": answer["state"], "chunks": shown} if not as_json else None), None


def _prefixed(text: str, prefix: str, at_line_start: bool) -> tuple[str, bool]:
    """``text`` with ``prefix`` at the start of each line; whether it ends at a line start."""
    out = []
    for line in text.splitlines(keepends=True):
        out.append((prefix if at_line_start else "") + line)
        at_line_start = line.endswith("\n")
    return "".join(out), at_line_start


# ---------------------------------------------------------------- parsing


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the API's JSON (errors too) instead of text")
    common.add_argument("--url", default=argparse.SUPPRESS, help="Colony's address (else COLONY_URL or config)")
    common.add_argument("--token", default=argparse.SUPPRESS, help="API token (else COLONY_TOKEN or config)")

    parser = argparse.ArgumentParser(
        prog="colony", parents=[common],
        description="Submit and follow GPU jobs on a Colony cluster.",
        epilog="Exit codes: 0 ok, 1 API error, 2 usage. Token and URL come from --token/--url, "
               "COLONY_TOKEN/COLONY_URL, or ~/.config/colony/config.toml (url = ..., token = ...).",
    )
    commands = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    login_parser = commands.add_parser("login", parents=[common],
                                       help="get an API token and keep it in the config file")
    login.add_arguments(login_parser)
    login_parser.set_defaults(run=None)

    submit_parser = commands.add_parser(
        "submit", parents=[common], help="submit a job or a batch script",
        usage="colony submit [options] -- COMMAND [ARG ...]\n       colony submit [options] SCRIPT [ARG ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit a job. Everything after -- is the command, run without a shell.\n\n"
                    "A batch script (a file starting with #! or ending in .sh) is uploaded with the code and run\n"
                    "by its #! interpreter (else bash). Lines at its top like\n"
                    "    #COLONY --gpus 2 --time 2h --name sweep\n"
                    "take the flags below, as sbatch reads #SBATCH; flags on the command line win.")
    submit.add_arguments(submit_parser)
    submit_parser.set_defaults(run=cmd_submit)

    queue = commands.add_parser("queue", parents=[common], help="list jobs with queue position and pending reason")
    queue.add_argument("--all", action="store_true", help="finished jobs too (default: pending and running)")
    queue.add_argument("--state", help="e.g. pending, running, failed (comma-separated)")
    queue.add_argument("--tenant", help="only this tenant")
    queue.add_argument("--mine", action="store_true", help="only my jobs")
    queue.add_argument("--owner", help="only this user's jobs")
    queue.add_argument("--limit", type=int, default=200, help="at most this many (default 200)")
    queue.set_defaults(run=cmd_queue)

    for verb, run, text in (("show", cmd_show, "a job's details"),
                            ("logs", cmd_logs, "what a job printed (so far, while it runs)")):
        sub = commands.add_parser(verb, parents=[common], help=text)
        sub.add_argument("id", type=int, help="job id")
        sub.set_defaults(run=run)
        if verb == "logs":
            sub.add_argument("-f", "--follow", action="store_true",
                             help="print output live while the job runs, until it ends")

    cancel_parser = commands.add_parser(
        "cancel", parents=[common], help="cancel jobs (stops them if running)",
        usage="colony cancel ID [ID ...]\n       colony cancel [--array ID] [--name PATTERN] [--mine] [--yes]",
        description="Cancel jobs by id, or every unfinished job that matches all of --array, --name and --mine "
                    "(after showing them and asking, unless --yes). Jobs that ran after_ok a cancelled job are "
                    "cancelled too.")
    cancel.add_arguments(cancel_parser)
    cancel_parser.set_defaults(run=cancel.cmd_cancel)

    shell_parser = commands.add_parser(
        "shell", parents=[common], help="an interactive session on a node (a terminal in a job)",
        usage="colony shell [options] [-- COMMAND [ARG ...]]\n       colony shell --attach ID",
        description="Start an interactive session: a job that runs COMMAND (default: bash -l) on a terminal, "
                    "placed and accounted like any other job, attached to this terminal once it runs. It ends "
                    "when the command exits (colony shell exits with its code) or after --idle without input. "
                    "Enter ~ . detaches and leaves it running. Takes colony submit's options; uploads no code "
                    "unless --code DIR is given.")
    shell.add_arguments(shell_parser)
    shell_parser.set_defaults(run=shell.cmd_shell)

    jupyter_parser = commands.add_parser(
        "jupyter", parents=[common], help="a notebook on a node (a Jupyter server in a job, opened in the browser)",
        usage="colony jupyter [options] [-- COMMAND [ARG ...]]\n       colony jupyter --attach ID",
        description="Start a notebook session: a job that runs COMMAND (default: jupyter lab), a Jupyter server "
                    "from the job's own environment (install jupyterlab in the virtualenv or conda environment "
                    "you pass with --venv or --conda), placed and accounted like any other job. Once it runs, "
                    "open it from its job page (Open notebook): the browser reaches it through Colony with your "
                    "sign-in. It ends after --idle without activity. Takes colony submit's options.")
    jupyter.add_arguments(jupyter_parser)
    jupyter_parser.set_defaults(run=jupyter.cmd_jupyter)

    history_parser = commands.add_parser("history", parents=[common],
                                         help="your finished jobs: state, runtime, GPU-hours, use")
    history.add_arguments(history_parser)
    history_parser.set_defaults(run=history.cmd_history)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    as_json = getattr(args, "json", False)
    try:
        if args.verb == "submit":
            submit.prepare(args)
        if args.verb == "login":
            result, text = login.cmd_login(args)
        else:
            client = Client(resolve(getattr(args, "url", None), getattr(args, "token", None)))
            result, text = args.run(client, args)
    except (ConfigError, Usage) as exc:
        parser.exit(USAGE, f"colony: error: {exc}\n")
    except ApiError as exc:
        return report_api_error(exc, as_json)
    if as_json and result is not None:
        print(json.dumps(result, indent=2))
    elif not as_json and text is not None:
        print(text)
    return getattr(args, "exit_status", OK)  # colony shell: the session's own exit code


def report_api_error(exc: ApiError, as_json: bool) -> int:
    if as_json:
        print(json.dumps(exc.body or {"error": {"code": "unreachable" if exc.status is None else "error",
                                                "message": str(exc), "fields": {}}}, indent=2))
    lines = [f"colony: error: {exc}"]
    for field, messages in exc.fields.items():
        for message in _messages(messages):
            if f"{field}: {message}" != str(exc):  # the headline already says it
                lines.append(f"  {field}: {message}")
    if exc.retry_after:
        lines.append(f"  try again in {exc.retry_after} s")
    print("\n".join(lines), file=sys.stderr)
    return API_ERROR


def _messages(value) -> list[str]:
    if isinstance(value, dict):
        return [m for item in value.values() for m in _messages(item)]
    if isinstance(value, list):
        return [m for item in value for m in _messages(item)]
    return [str(value)]
