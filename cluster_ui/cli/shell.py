"""``colony shell``: an interactive session, as ``srun --pty bash`` gives one. It submits an
ordinary job marked interactive (placed, accounted and ended like any other), waits until it runs
(saying why it waits), and attaches this terminal to the job's: keystrokes go to the API with the
user's token, what the job's terminal prints comes back by long poll. ``--attach ID`` attaches to
a session already running. The session ends when its shell exits (``colony shell`` then exits
with its code) or after ``--idle`` without input; ``Enter ~ .`` detaches and leaves it running.
Nothing here talks HTTP but through ``Client``.
"""

from __future__ import annotations

import argparse
import base64
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
import urllib.parse

from agents import units
from cluster_ui.cli import submit
from cluster_ui.cli.client import ApiError, Client, Usage

DEFAULT_COMMAND = ["bash", "-l"]
INPUT_BYTES = 4096  # the API takes at most this much a request
WAIT_POLL_S = 1.0
DETACH = b"\r~."
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    submit.add_arguments(parser)
    parser.add_argument("--idle", metavar="DURATION",
                        help="end the session after this long without input, e.g. 30m (default 30m)")
    parser.add_argument("--attach", type=int, metavar="ID", help="attach to session ID instead of starting one")


def cmd_shell(client: Client, args) -> tuple[object, None]:
    if args.attach is not None:
        job_id = args.attach
        session = client.get(f"api/v1/jobs/{job_id}/").get("session") or {}
        if session.get("kind") == "notebook":  # colony jupyter's: a browser opens it, no terminal
            raise Usage(_notebook_not_terminal(client, job_id, session))
    else:
        job_id = _submit(client, args)
    job = wait_until_running(client, job_id, cancel_on_interrupt=args.attach is None)
    if job["state"] == "RUNNING":
        job = attach(client, job_id)
    args.exit_status = _exit_status(job)
    return job, None


def _submit(client: Client, args) -> int:
    body = session_body(args, "interactive", DEFAULT_COMMAND)
    # The remote terminal speaks what this one does; the API refuses no TERM.
    body["env"] = {"TERM": os.environ.get("TERM") or "xterm-256color", **body.get("env", {})}
    return submit_session(client, args, body, "session")


def session_body(args, kind: str, default_command: list[str]) -> dict:
    """The job a session command (``colony shell``, ``colony jupyter``) submits: the submit flags,
    one GPU unless told, the command or ``default_command``, ``kind`` set, its idle timeout."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    args.command = command or default_command
    args.gpus_given = args.gpus is not None
    args.gpus = 1 if args.gpus is None else args.gpus
    body = submit.job_body(args)
    body[kind] = True
    if args.idle:
        try:
            body["idle_timeout_s"] = units.parse_duration(args.idle)
        except ValueError as exc:
            raise Usage(str(exc)) from None
    return body


def submit_session(client: Client, args, body: dict, noun: str) -> int:
    if args.code:  # a session starts in an empty folder unless told to bring code (or --workdir)
        body["code"] = submit.upload_code(client, args.code, args.tenant)
    answer = client.post("api/v1/jobs/", body)
    _say(f"Submitted {noun} {answer['id']} to {answer['tenant']}: {answer['state'].lower()}.")
    return answer["id"]


def wait_until_running(client: Client, job_id: int, *, cancel_on_interrupt: bool) -> dict:
    """Poll the job until it runs or ends, printing why it waits whenever the reason changes.
    Ctrl-C while it waits cancels a session this command started (nobody would attach to it)."""
    said = None
    try:
        while True:
            job = client.get(f"api/v1/jobs/{job_id}/")
            if job.get("session") is None and "session" in job:
                raise Usage(f"job {job_id} is a batch job, not an interactive session: see colony logs {job_id}")
            if job["state"] == "RUNNING" or job["state"] in TERMINAL_STATES:
                return job
            reason = (job.get("pending_reason") or {}).get("message") or job["state"].lower()
            if reason != said:
                _say(f"Waiting: {reason}")
                said = reason
            time.sleep(WAIT_POLL_S)
    except KeyboardInterrupt:
        if not cancel_on_interrupt:
            raise
        client.post(f"api/v1/jobs/{job_id}/cancel/")
        _say(f"Interrupted: session {job_id} cancelled.")
        return client.get(f"api/v1/jobs/{job_id}/")


def _notebook_not_terminal(client: Client, job_id: int, session: dict) -> str:
    where = urllib.parse.urljoin(client.settings.url, session.get("open") or f"/jobs/{job_id}/notebook/")
    return (f"job {job_id} is a notebook session, not a terminal: open it in a browser at {where} "
            f"(or from its job page; colony jupyter --attach {job_id} says so too)")


def attach(client: Client, job_id: int) -> dict:
    """Relay this terminal to the session's until it ends (or ``Enter ~ .``); returns the job."""
    _say(f"Attached to session {job_id} (Enter ~ . detaches; the session then goes on).")
    stdin = sys.stdin.fileno()
    is_tty = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if is_tty else None
    relay = _Relay(client, job_id)
    previous = signal.signal(signal.SIGWINCH, lambda *_: relay.send_size()) if is_tty else None
    try:
        if is_tty:
            tty.setraw(stdin)
        relay.send_size()
        output = threading.Thread(target=relay.show_output, daemon=True)
        output.start()
        relay.forward_input(stdin)
        output.join()
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
    if relay.detached:
        _say(f"\r\nDetached; session {job_id} goes on: colony shell --attach {job_id}")
        return relay.job
    job = relay.job
    code = f" (exit code {job['exit_code']})" if job.get("exit_code") is not None else ""
    _say(f"\r\nSession {job_id} ended: {job['state']}{code}.")
    return job


class _Relay:
    def __init__(self, client: Client, job_id: int):
        self.client, self.job_id = client, job_id
        self.job: dict = {"id": job_id, "state": "RUNNING", "exit_code": None}
        self.ended = threading.Event()
        self.detached = False
        self.error: str | None = None
        self.refused = False

    def send_size(self) -> None:
        try:
            size = os.get_terminal_size(sys.stdout.fileno())
        except OSError:
            return
        self._send({"rows": size.lines, "cols": size.columns})

    def _send(self, body: dict) -> bool:
        try:
            self.client.post(f"api/v1/jobs/{self.job_id}/session/input/", body)
            return True
        except ApiError as exc:
            if exc.status in (404, 409, 403):  # over, or not ours: nothing more to type into
                self.error, self.refused = str(exc), exc.status == 403
                _say(f"\r\ncolony: {exc}\r")
                return False
            raise

    def forward_input(self, fd: int) -> None:
        seen = b"\r"  # the start counts as a line start
        while not self.ended.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(fd, INPUT_BYTES)
            if not data:  # stdin ended (a pipe): end the shell's input as a terminal's Ctrl-D would
                self._send({"data": base64.b64encode(b"\x04").decode()})
                self.ended.wait()
                return
            window, seen = seen + data, (seen + data)[-2:]
            if DETACH in window:
                self.detached = True
                self.ended.set()
                return
            if not self._send({"data": base64.b64encode(data).decode()}):
                if self.refused:  # not ours to type into: let go rather than hold a raw terminal
                    self.detached = True
                    self.ended.set()
                self.ended.wait(5)
                return

    def show_output(self) -> None:
        out = sys.stdout.buffer
        after, eof = None, False
        try:
            while not self.detached:
                answer = self.client.get(f"api/v1/jobs/{self.job_id}/session/output/", after=after,
                                         wait=1 if eof else 20)
                data = base64.b64decode(answer["data"])
                if data:
                    out.write(data)
                    out.flush()
                after, eof = answer["next"] or after, eof or answer["eof"]
                self.job = {**self.job, "state": answer["state"], "exit_code": answer["exit_code"]}
                if answer["ended"]:
                    return
        except ApiError as exc:
            self.error = str(exc)
        finally:
            self.ended.set()


def _exit_status(job: dict) -> int:
    if job["state"] == "RUNNING":
        return 0  # detached: it goes on
    code = job.get("exit_code")
    return code if isinstance(code, int) and 0 <= code < 256 else (0 if job["state"] == "SUCCEEDED" else 1)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
