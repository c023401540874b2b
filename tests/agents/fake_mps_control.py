#!/usr/bin/env python3
"""A fake ``nvidia-cuda-mps-control`` for the isolation tests: no GPU, same interface.

- ``fake_mps_control.py -d`` starts a "daemon" (this script with ``--serve``, in a session of its
  own) for the pipe directory in ``$CUDA_MPS_PIPE_DIRECTORY``: it writes ``fake-daemon.pid`` and the
  ``control`` pipe's stand-in there, and runs until told to quit.
- With no argument it reads commands on stdin, as the real one does: ``quit`` (stop the daemon),
  ``get_server_list`` (its server's pid; exit 1 when no daemon runs), and, for tests, ``die``
  (SIGKILL the daemon, as a crash would: its files stay), ``start_server`` (start a stand-in MPS
  server, as a first client would) and ``kill_server`` (SIGKILL it, as a client's fatal fault would).

Every invocation appends one JSON line to ``$NVIDIA_FAKE_MPS_LOG`` (when set): ``argv``, the MPS
variables (``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``) and
``stdin``. ``$NVIDIA_FAKE_MPS_FAIL``: comma-separated GPU UUIDs (or ``all``) whose ``-d`` fails.
The variables are named NVIDIA_* because the agent passes those (and few others) to the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

MPS_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def _daemon_pid() -> int | None:
    try:
        pid = int((_pipe_dir() / "fake-daemon.pid").read_text())
        return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, psutil.Error):
        return None


def _server_pid() -> int | None:
    try:
        pid = int((_pipe_dir() / "fake-server.pid").read_text())
        return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, psutil.Error):
        return None


def _record(stdin: str) -> None:
    path = os.environ.get("NVIDIA_FAKE_MPS_LOG")
    if path:
        entry = {"argv": sys.argv[1:], "env": {name: os.environ.get(name) for name in MPS_VARIABLES}, "stdin": stdin}
        with open(path, "a") as log:
            log.write(json.dumps(entry) + "\n")


def _serve() -> int:
    pipe = _pipe_dir()

    def leave(_signum, _frame):
        (pipe / "fake-daemon.pid").unlink(missing_ok=True)
        (pipe / "control").unlink(missing_ok=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    (pipe / "control").write_text("")
    (pipe / "fake-daemon.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(3600)


def _start() -> int:
    failing = os.environ.get("NVIDIA_FAKE_MPS_FAIL", "")
    if failing == "all" or os.environ.get("CUDA_VISIBLE_DEVICES", "") in failing.split(","):
        print("An MPS control daemon could not be started (fake failure)", file=sys.stderr)
        return 1
    subprocess.Popen([sys.executable, __file__, "--serve"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    deadline = time.monotonic() + 5
    while _daemon_pid() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return 0 if _daemon_pid() is not None else 1


def _control(commands: str) -> int:
    for command in commands.split():
        pid = _daemon_pid()
        if pid is None:
            print("Cannot find MPS control daemon process")
            return 1
        if command == "get_server_list":
            server = _server_pid()
            if server is not None:
                print(server)
        elif command == "start_server":  # what a first client makes the real daemon do
            server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, close_fds=True)
            (_pipe_dir() / "fake-server.pid").write_text(str(server.pid))
        elif command == "kill_server":  # a fatal fault in a client takes its server down
            os.kill(_server_pid(), signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _server_pid() is not None and time.monotonic() < deadline:
                time.sleep(0.01)
        elif command in ("quit", "die"):
            server = _server_pid()
            if server is not None:  # quit shuts its servers down; a dying daemon takes them along
                os.kill(server, signal.SIGKILL)
            os.kill(pid, signal.SIGTERM if command == "quit" else signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _daemon_pid() == pid and time.monotonic() < deadline:
                time.sleep(0.01)  # gone, or a zombie nobody reaps yet: either way no daemon
    return 0


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return _serve()
    if sys.argv[1:] == ["-d"]:
        _record("")
        return _start()
    commands = sys.stdin.read()
    _record(commands)
    return _control(commands)


if __name__ == "__main__":
    sys.exit(main())
