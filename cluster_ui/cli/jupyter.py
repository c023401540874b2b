"""``colony jupyter``: a notebook on a GPU, as Open OnDemand's Jupyter app gives one. It submits an
ordinary job (placed, accounted and ended like any other) that runs a Jupyter server from the
job's own software environment, waits until it runs (saying why it waits), and prints where the
browser opens it: the dashboard's job page, through which the control plane reaches the server
with the user's sign-in (no port on a node is open; the server's token never leaves Colony). The
server ends after ``--idle`` without activity. Nothing here talks HTTP but through ``Client``.
"""

from __future__ import annotations

import argparse
import time
import urllib.parse

from agents import units
from cluster_ui.cli import shell, submit
from cluster_ui.cli.client import Client, Usage

DEFAULT_COMMAND = ["jupyter", "lab"]
# A job whose environment has no jupyter fails moments after it starts: wait this long for that
# before saying where to open it.
SETTLE_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    submit.add_arguments(parser)
    parser.add_argument("--idle", metavar="DURATION",
                        help="end the notebook after this long without activity, e.g. 2h (default 30m)")
    parser.add_argument("--attach", type=int, metavar="ID", help="where to open notebook ID, already submitted")


def cmd_jupyter(client: Client, args) -> tuple[object, str | None]:
    job_id = args.attach if args.attach is not None else _submit(client, args)
    job = shell.wait_until_running(client, job_id, cancel_on_interrupt=args.attach is None)
    if (job.get("session") or {}).get("kind") != "notebook":
        raise Usage(f"job {job_id} is a terminal session, not a notebook: colony shell --attach {job_id}")
    deadline = time.monotonic() + SETTLE_S
    while job["state"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(shell.WAIT_POLL_S)
        job = client.get(f"api/v1/jobs/{job_id}/")
    if job["state"] != "RUNNING":
        args.exit_status = 1
        code = f" (exit code {job['exit_code']})" if job.get("exit_code") is not None else ""
        why = [f"Notebook {job_id} ended: {job['state']}{code}."]
        why += [job["error"]] if job.get("error") else []
        why += [job["output_tail"].rstrip()] if job.get("output_tail") else []
        return job, "\n".join(why)
    where = urllib.parse.urljoin(client.settings.url, (job.get("session") or {}).get("open")
                                 or f"/jobs/{job_id}/notebook/")
    idle = (job.get("session") or {}).get("idle_timeout_s")
    return job, (f"Notebook {job_id} runs. Open it in your browser, signed in to the dashboard:\n  {where}\n"
                 f"(or the job page's Open notebook). It ends after {units.format_duration(idle) if idle else '30m'} "
                 f"without activity; colony cancel {job_id} ends it now.")


def _submit(client: Client, args) -> int:
    return shell.submit_session(client, args, shell.session_body(args, "notebook", DEFAULT_COMMAND), "notebook")
