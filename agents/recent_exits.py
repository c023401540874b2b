"""The exits this agent sent lately, kept in memory and, one JSON line each, in the work directory.

Redis keeps nothing on disk, so an exit it took just before it restarted may be gone unread: the
agent sends the recent ones again after a reconnect (the control plane ignores an exit it already
applied). An agent started after a crash reads the file back, so that a re-sent launch, a stop or
a query about an attempt it took over is answered with its real exit instead of silence (a job
stuck PLACED) or "absent" (a finished job run again). No Redis here.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from pathlib import Path

import pydantic

from agents import protocol

log = logging.getLogger(__name__)

# Exits sent in the last RECENT_EXITS_S seconds are sent again after a reconnect.
RECENT_EXITS = 256
RECENT_EXITS_S = 600.0
RECENT_EXITS_FILE = "recent-exits.jsonl"


class RecentExits:
    """``(monotonic time sent, JobExited)`` pairs, oldest first, at most RECENT_EXITS of them."""

    def __init__(self, workdir: Path, node: str):
        self._path = Path(workdir) / RECENT_EXITS_FILE
        self._node = node
        self._sent: deque[tuple[float, protocol.JobExited]] = deque(maxlen=RECENT_EXITS)
        self._kept = 0  # lines in the file

    def __iter__(self):
        return iter(self._sent)

    def add(self, message: protocol.JobExited) -> None:
        self._sent.append((time.monotonic(), message))
        if not message.absent:
            self._keep(message)

    def find(self, job_id: int, launch_id: str | None) -> protocol.JobExited | None:
        """The exit sent for that attempt (never an "absent" answer), if one was sent lately."""
        if launch_id is None:
            return None
        for _sent_at, message in reversed(self._sent):
            if message.job_id == job_id and message.launch_id == launch_id and not message.absent:
                return message
        return None

    def to_send_again(self, outbox) -> list[protocol.JobExited]:
        """The exits sent in the last RECENT_EXITS_S seconds that are not waiting in ``outbox``.
        Never an "absent" answer: true when given, false once a re-sent launch of that attempt
        ran here; replayed then, it read as the running attempt vanishing and ran the job twice
        (the soak, issue 35). A lost answer costs nothing: the control plane asks again."""
        now = time.monotonic()
        return [m for t, m in self._sent if now - t < RECENT_EXITS_S and not m.absent and m not in outbox]

    def _keep(self, message: protocol.JobExited) -> None:
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self._path, "a", encoding="utf-8", opener=_private) as file:
                file.write(_exit_line(time.time(), message))
            self._kept += 1
            if self._kept > 2 * RECENT_EXITS:
                self._save()
        except OSError as exc:
            log.warning("could not keep job %d's exit on disk (%s); it is kept in memory only", message.job_id, exc)

    def _save(self) -> None:
        """Rewrite the file with the exits still remembered (it would otherwise grow for ever)."""
        now, wall = time.monotonic(), time.time()
        lines = [_exit_line(wall - (now - sent_at), message) for sent_at, message in self._sent
                 if not message.absent]
        partial = self._path.with_suffix(".tmp")
        with open(partial, "w", encoding="utf-8", opener=_private) as file:
            file.writelines(lines)
        partial.replace(self._path)
        self._kept = len(lines)

    def load(self) -> None:
        """The exits an earlier agent on this node sent in the last RECENT_EXITS_S seconds."""
        path = self._path
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s: unreadable (%s); earlier exits are not remembered", path, exc)
            return
        now, wall = time.monotonic(), time.time()
        for line in lines[-RECENT_EXITS:]:
            try:
                kept = json.loads(line)
                at, message = float(kept["at"]), protocol.JobExited.model_validate(kept["exit"])
            except (ValueError, TypeError, KeyError, pydantic.ValidationError):
                continue  # (a line cut short by a crash)
            if 0 <= wall - at < RECENT_EXITS_S and message.node == self._node:
                self._sent.append((now - (wall - at), message))
        try:
            self._save()
        except OSError as exc:
            log.warning("%s: not rewritten (%s)", path, exc)


def _exit_line(at: float, message: protocol.JobExited) -> str:
    """One line of RECENT_EXITS_FILE: when the exit was sent (wall clock) and the exit."""
    return json.dumps({"at": at, "exit": message.model_dump(mode="json")}) + "\n"


def _private(path, flags):
    """``open(..., opener=_private)``: the file readable by this user only, never followed through a link."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
